"""The launcher's heartbeat, piece by piece: what a node decides from it, against moto's S3.

The launcher rewrites PREFIX/control/launcher.json on every poll; each node stops its ranks (with a
checkpoint) and powers off once that object has not changed for `heartbeat_timeout_min`, measured on
the node's own clock. The whole path - a real launcher SIGKILLed, the real user data on this machine -
is in tests/test_aws_bootstrap.py; here the decisions are checked one by one, with the node's clock
under the test's control (no sleeping, no timing).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3", reason="boto3 is not installed: pip install boto3")
pytest.importorskip("moto.server", reason='moto server is not installed: pip install "moto[server]"')

from scalelab.aws import bootstrap  # noqa: E402
from scalelab.aws.bootstrap import (  # noqa: E402
    LAUNCHER_HEARTBEAT,
    LAUNCHER_LOST,
    SPOT_NOTICE,
    STOP_REQUESTED,
    Config,
    LauncherWatch,
    Sync,
    final_state,
    late_stop_reason,
    stop_ranks,
    stop_reason,
)
from scalelab.aws.render import make_plan, user_data  # noqa: E402
from scalelab.core.errors import SpecError  # noqa: E402
from scalelab.core.spec import Spec  # noqa: E402
from scalelab.launcher.backend import get_backend  # noqa: E402

KEYS = {"aws_access_key_id": "AKIAHEARTBEATTEST", "aws_secret_access_key": "heartbeat/test"}


class Clock:
    """The node's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(moto_url, monkeypatch):
    """A node's S3 view of one run (real moto S3) and its clock."""
    s3 = boto3.Session(region_name="us-east-1", **KEYS).client("s3", endpoint_url=moto_url)
    bucket = f"scalelab-beat-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    cfg = Config({"SCALELAB_RUN_ID": "r1", "SCALELAB_BUCKET": bucket, "SCALELAB_PREFIX": "scalelab/r1",
                  "SCALELAB_HEARTBEAT_TIMEOUT_S": "600"})
    clock = Clock()
    monkeypatch.setattr(bootstrap.time, "monotonic", clock)
    return Sync(s3, cfg, "i-1", 0), clock


def beat(sync: Sync, n: int) -> None:
    """What the launcher's poll writes (a new body, so a new ETag)."""
    sync.put_json(LAUNCHER_HEARTBEAT, {"time": n})


def test_a_changing_heartbeat_keeps_the_node_going_and_a_still_one_stops_it(node):
    sync, clock = node
    watch = LauncherWatch(sync, timeout_s=600)
    for n in range(5):  # the launcher polls: the object changes, the age starts again each time
        beat(sync, n)
        clock.now += 500
        assert not watch.gone()
    clock.now += 500  # unchanged for 500 s: not yet
    assert not watch.gone()
    clock.now += 101  # unchanged for 601 s
    assert watch.gone()
    beat(sync, 99)  # a launcher that comes back in time is followed again
    assert not watch.gone()


def test_no_heartbeat_at_all_counts_from_the_nodes_start(node):
    """The launcher died before its first poll reached S3 (or the object was deleted)."""
    sync, clock = node
    watch = LauncherWatch(sync, timeout_s=600)
    clock.now += 600
    assert not watch.gone()
    clock.now += 1
    assert watch.gone()


def test_an_s3_error_is_no_news_and_does_not_restart_the_age(node):
    sync, clock = node
    beat(sync, 1)
    watch = LauncherWatch(sync, timeout_s=600)
    assert not watch.gone()
    from botocore.config import Config as BotoConfig
    from botocore.exceptions import EndpointConnectionError

    sync.s3 = boto3.Session(region_name="us-east-1", **KEYS).client(  # S3 unreachable from the node
        "s3", endpoint_url="http://127.0.0.1:9", config=BotoConfig(retries={"max_attempts": 1}, connect_timeout=2))
    with pytest.raises(EndpointConnectionError):
        sync.etag(LAUNCHER_HEARTBEAT)
    clock.now += 601
    assert watch.gone()


def test_why_a_node_stops(node):
    sync, clock = node
    watch = LauncherWatch(sync, timeout_s=600)
    beat(sync, 1)
    assert stop_reason(sync, None, watch) is None
    clock.now += 601
    assert stop_reason(sync, None, watch) == LAUNCHER_LOST
    sync.put_json("control/stop", {})
    assert stop_reason(sync, None, watch) == STOP_REQUESTED  # a cancel is said as a cancel
    assert stop_reason(sync, {"action": "terminate"}, watch) == SPOT_NOTICE
    assert stop_reason(sync, None, watch, peer="i-0second") == SPOT_NOTICE  # EC2 warned another instance of the run


def test_a_peers_notice_is_found_and_this_instances_own_is_not(node):
    sync, _ = node
    assert sync.peer_notice() is None
    sync.put_json(f"events/gen-0/{sync.instance_id}.json", {"event": "spot_interruption"})
    assert sync.peer_notice() is None  # its own notice: said by `notice`, not as a peer's
    sync.put_json("events/gen-0/i-0second.json", {"event": "spot_interruption"})
    sync.put_json("events/gen-1/i-0third.json", {"event": "spot_interruption"})  # another generation's
    assert sync.peer_notice() == "i-0second"


def test_ranks_stopped_by_another_nodes_cancel_before_this_node_saw_it_say_the_cancel(node):
    """The ranks agree on a stop step, so the node that sees `launch cancel` first stops every node's ranks;
    one that had not polled yet must still say why they stopped (a CI run's Horovod node said None)."""
    sync, _ = node
    leader_status = "status/gen-0/i-leader.json"
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") is None  # nothing asked: no reason
    assert late_stop_reason(sync, sync.cfg, None, "i-leader") is None  # a Horovod node, no leader status yet
    sync.put_json("control/stop", {})
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") == STOP_REQUESTED
    assert final_state(object(), 0, STOP_REQUESTED, True) == "interrupted"  # ranks that stopped early on it
    assert final_state(object(), 0, STOP_REQUESTED, False) == "completed"  # a cancel after the last step
    sync.put_json(leader_status, {"state": "completed", "reason": None})
    assert late_stop_reason(sync, sync.cfg, None, "i-leader") is None  # a Horovod node says what its leader says
    sync.put_json(leader_status, {"state": "interrupted", "reason": SPOT_NOTICE})
    assert late_stop_reason(sync, sync.cfg, None, "i-leader") == SPOT_NOTICE
    sync.s3.put_object(Bucket=sync.cfg.bucket, Key=sync.cfg.key(leader_status), Body=b"{cut")
    assert late_stop_reason(sync, sync.cfg, None, "i-leader") is None  # a torn status is no answer, not a crash


def test_ranks_stopped_by_another_nodes_lost_launcher_say_the_launcher_was_lost(node, monkeypatch):
    """The node that first sees the launcher's heartbeat stand still stops its ranks, and every node's ranks
    stop with them (one stop step); a node whose ranks ended before its own watch fired said `cancelled`
    (their clean stop looked like a signal to a rank; found by tests/test_aws_two_instances.py's killed
    launcher). The stopping node names its reason in `stops/` before it signals: the others read it."""
    sync, _ = node
    monkeypatch.setattr(sync.cfg, "nodes", 2)
    monkeypatch.setattr(bootstrap, "signal_local_ranks", lambda *a, **k: None)  # no ranks in this test
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") is None
    other = Sync(sync.s3, sync.cfg, "i-2", 1)
    stop_ranks(other, sync.cfg, None, LAUNCHER_LOST, None, "i-2", 1)  # the second node's watch fired first
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") == LAUNCHER_LOST
    assert late_stop_reason(other, sync.cfg, object(), "i-leader") is None  # its own entry is not a peer's
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader", early=False) is None  # ranks that crashed or ended
    monkeypatch.setattr(sync.cfg, "generation", 1)
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") is None  # the last generation's stop is not ours
    monkeypatch.setattr(sync.cfg, "generation", 0)
    assert final_state(object(), 1, LAUNCHER_LOST, True, True) == "interrupted"  # not cancelled: resumable
    sync.put_json("control/stop", {})
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") == STOP_REQUESTED  # a cancel says so first
    monkeypatch.setattr(sync.cfg, "nodes", 1)
    sync.s3.delete_object(Bucket=sync.cfg.bucket, Key=sync.cfg.key("control/stop"))
    assert late_stop_reason(sync, sync.cfg, object(), "i-leader") is None  # one node: no peers to ask


def test_a_stop_that_s3_cannot_record_still_stops_the_ranks(node, monkeypatch, capsys):
    """The stop's `stops/` (and a notice's `events/`) entry goes to S3 before the signal; S3 failing (the very
    case the launcher watch is for) must not leave the ranks running without their checkpoint."""
    sync, _ = node
    monkeypatch.setattr(sync.cfg, "nodes", 2)
    monkeypatch.setattr(bootstrap, "signal_local_ranks", lambda *a, **k: None)

    def unreachable(*args, **kwargs):
        raise ConnectionError("S3 is unreachable")

    monkeypatch.setattr(sync, "put_json", unreachable)
    sent = []
    proc = type("Agent", (), {"pid": 1, "send_signal": lambda self, sig: sent.append(sig)})()
    stop_ranks(sync, sync.cfg, proc, LAUNCHER_LOST, {"action": "terminate"}, "i-1", 0)
    assert sent == [bootstrap.signal.SIGTERM]
    assert "could not record the stop in S3" in capsys.readouterr().err


@pytest.mark.parametrize("has_proc, code, reason, stopped, state", [
    (True, 0, None, False, "completed"),
    (True, 0, LAUNCHER_LOST, False, "completed"),  # finished before the stop mattered
    (True, 0, SPOT_NOTICE, True, "interrupted"),  # horovodrun exits 0 once its ranks stopped on its SIGTERM
    (True, 0, SPOT_NOTICE, False, "completed"),  # a notice (here or on a peer) after the last step: too late
    (True, 0, None, True, "completed"),  # no stop asked here: an earlier generation's record
    (True, 143, LAUNCHER_LOST, False, "interrupted"),
    (True, 143, None, False, "interrupted"),  # SIGTERM from elsewhere (shutdown): checkpointed
    (True, 1, None, False, "failed"),
    (True, 1, SPOT_NOTICE, False, "interrupted"),
    (False, 0, STOP_REQUESTED, False, "interrupted"),  # a horovod node without ranks of its own
    (False, 0, None, False, "completed"),
])
def test_final_state(has_proc, code, reason, stopped, state):
    assert final_state(object() if has_proc else None, code, reason, stopped) == state


@pytest.mark.parametrize("leader_state, state", [("cancelled", "cancelled"), ("interrupted", "completed"),
                                                 ("completed", "completed"), ("failed", "completed"), (None, "completed")])
def test_a_horovod_node_without_ranks_ends_as_its_leader_says_its_ranks_did(leader_state, state):
    """A signal to the second instance's rank (started there by the leader's horovodrun over ssh) cancels the
    run: the leader sees it in the ranks' records, this node has none and said `completed` (found by
    tests/test_aws_two_instances.py's signal test). A leader's failure is not this node's: it did not run.
    A reason of its own (it stopped the ranks, or the leader's via late_stop_reason) comes first; the leader
    interrupted without one (an outside SIGTERM to horovodrun) is not this node's notice."""
    assert final_state(None, 0, None, leader_state=leader_state) == state
    assert final_state(None, 0, LAUNCHER_LOST, leader_state=leader_state) == "interrupted"


def test_the_limit_reaches_the_user_data_and_a_limit_below_three_polls_is_refused():
    spec = Spec.from_dict({"backend": "aws", "model": "nmt-tiny", "engine": {"name": "single"}, "steps": 10})
    options = get_backend("aws", {"bucket": "bkt", "heartbeat_timeout_min": 2.5}).options
    plan = make_plan(spec, Path("runs/r1"), options, "us-east-1")
    assert "export SCALELAB_HEARTBEAT_TIMEOUT_S=150\n" in user_data(plan, 0)
    assert Config({"SCALELAB_RUN_ID": "r1", "SCALELAB_BUCKET": "b", "SCALELAB_PREFIX": "p",
                   "SCALELAB_HEARTBEAT_TIMEOUT_S": "150"}).heartbeat_timeout_s == 150
    too_short = get_backend("aws", {"bucket": "bkt", "heartbeat_timeout_min": 0.5, "poll_s": 20}).options
    with pytest.raises(SpecError, match=r"heartbeat_timeout_min 0.5 is shorter than three .*\(poll_s 20\)"):
        make_plan(spec, Path("runs/r1"), too_short, "us-east-1")
    with pytest.raises(SpecError, match="heartbeat_timeout_min"):
        get_backend("aws", {"bucket": "bkt", "heartbeat_timeout_min": 0})


@pytest.mark.parametrize("resolves, says", [
    ("127.0.1.1", "resolves to 127.0.1.1, a loopback address"),  # Debian's default /etc/hosts
    ("127.0.0.1", "resolves to 127.0.0.1, a loopback address"),
    (OSError("Name or service not known"), "does not resolve (Name or service not known)"),
    ("10.0.1.5", None),  # the VPC's DNS: the private address
])
def test_a_hostname_horovod_cannot_use_across_instances_is_named_before_any_rank_starts(monkeypatch, resolves, says):
    """Horovod 0.28's Gloo process sets connect on the hostname's address whatever HOROVOD_GLOO_IFACE says
    (found playing two instances in namespaces: every rank aborted with 'connect [127.0.0.1]'). The bootstrap
    says so, with the fix, instead of starting ranks that abort."""
    def lookup(name: str) -> str:
        assert name == "ip-10-0-1-5"
        if isinstance(resolves, Exception):
            raise resolves
        return resolves

    monkeypatch.setattr(bootstrap.socket, "gethostname", lambda: "ip-10-0-1-5")
    monkeypatch.setattr(bootstrap.socket, "gethostbyname", lookup)
    problem = bootstrap.hostname_problem("10.0.1.5")
    if says is None:
        assert problem is None
    else:
        assert says in problem and "'ip-10-0-1-5'" in problem and "10.0.1.5" in problem and "/etc/hosts" in problem


def test_a_ranks_error_record_set_aside_is_uploaded_and_counts_as_no_rank(node, tmp_path):
    """A rank whose records file cannot grow writes its `error` record to records/error-rank-R.jsonl beside it
    (core.records `errors_aside`); the node uploaded only rank-R.jsonl, so the launcher never saw the rank's words.
    Now both go to records/gen-G/; the file aside is the same rank's, not one more rank that started (the count
    a cancel says and waits by)."""
    from scalelab.aws.backend import _ranks_started

    sync, _ = node
    cfg = Config({"SCALELAB_RUN_ID": "r1", "SCALELAB_BUCKET": sync.cfg.bucket, "SCALELAB_PREFIX": "scalelab/r1",
                  "SCALELAB_GENERATION": "3", "SCALELAB_WORK": str(tmp_path)})
    records = cfg.run_dir / "records"
    records.mkdir(parents=True)
    (records / "rank-0.jsonl").write_text('{"kind": "start", "rank": 0, "world": 1, "time": 1.0}\n')
    (records / "error-rank-0.jsonl").write_text('{"kind": "error", "rank": 0, "world": 1, "time": 2.0, '
                                                '"message": "cannot write records: File too large"}\n')
    Sync(sync.s3, cfg, "i-1", 0).push()
    listing = sync.s3.list_objects_v2(Bucket=cfg.bucket, Prefix="scalelab/r1/records/")
    assert sorted(o["Key"] for o in listing["Contents"]) == ["scalelab/r1/records/gen-3/error-rank-0.jsonl",
                                                             "scalelab/r1/records/gen-3/rank-0.jsonl"]
    assert _ranks_started(sync.s3, cfg.bucket, "scalelab/r1/", 3) == 1


def test_a_rank_with_an_error_set_aside_did_not_stop_cleanly_on_a_signal(tmp_path):
    """Every rank's last `end` says interrupted, but rank 1's error record went aside (its file could not take
    it): that rank failed, so the node must not report the run `cancelled` (a clean stop on a signal)."""
    from scalelab.aws.bootstrap import ranks_stopped_on_a_signal

    records = tmp_path / "records"
    records.mkdir()
    for rank in (0, 1):
        (records / f"rank-{rank}.jsonl").write_text(f'{{"kind": "event", "event": "end", "rank": {rank}, '
                                                    f'"reason": "interrupted"}}\n')
    assert ranks_stopped_on_a_signal(tmp_path)
    (records / "error-rank-1.jsonl").write_text('{"kind": "error", "rank": 1, "message": "File too large"}\n')
    assert not ranks_stopped_on_a_signal(tmp_path)
