"""Built-in price data (CSV files); a package so that setuptools ships the files."""
