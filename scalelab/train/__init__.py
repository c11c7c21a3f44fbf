"""scalelab trainer: LSTM models, data, distributed engines and per-step records."""
