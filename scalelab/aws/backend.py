"""The `aws` backend: the trainer on EC2 GPU instances (on-demand or spot) through boto3.

schedule: build a wheel of this checkout, put it and the resolved spec in S3, create the run's
security group (traffic only inside it) and cluster placement group, start the instances with the
user-data bootstrap (scalelab/aws/bootstrap.py runs there). poll (each tick of scalelab/launcher/runner.py's follow
loop, at most every `poll_s`): mirror the run's S3 prefix into RUN_DIR (records merged per rank
across generations, so `launch report` works unchanged), watch the nodes' states, replace spot
capacity after an interruption (same type, then the fallbacks; the new generation resumes from the
checkpoint in S3), enforce the time limit and the "never reported" limit, and rewrite the launcher's
heartbeat (control/launcher.json). finish and cancel tear everything down, and the runner calls one
of them on every way out (also on SIGINT, SIGTERM, SIGHUP). Where nothing can run in the launcher
(SIGKILL, a dead laptop), the nodes see its heartbeat stop changing and, after
`heartbeat_timeout_min`, checkpoint and terminate themselves (scalelab/aws/bootstrap.py); `launch aws gc`
removes the groups left. Interruptions, replacements and instance-seconds go to
RUN_DIR/records/aws-events.jsonl for the cost analysis.

Clients are injected (`clients={"ec2": ..., "s3": ...}` or `session=`) so tests point the backend at
moto; boto3 is imported only when a request is sent.

Order inside the module: options, request (render is in scalelab/aws/render.py), schedule, poll, finish,
status/logs/cancel.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from scalelab.aws import mirror, render
from scalelab.aws import teardown as td
from scalelab.aws.bootstrap import GC_RECORD, LAUNCHER_HEARTBEAT, LAUNCHER_LOST, STOP_REQUEST, STOP_REQUESTED, is_missing, node_order
from scalelab.aws.options import AwsOptions, default_region
from scalelab.aws.render import AwsRequest, Plan
from scalelab.core.errors import ScalelabError, SpecError, shell_word
from scalelab.core.lock import RunBusy
from scalelab.core.records import RANK_FILE
from scalelab.core.rundir import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUNNING,
    TERMINAL,
    UNKNOWN,
    RunPaths,
    edit_state,
    read_state,
    record_state,
    start_state,
    update_state,
)
from scalelab.core.spec import Spec, read_spec
from scalelab.core.waiting import wait_until
from scalelab.launcher.backend import STOP_NOW, Backend, RankOutput, RunStatus, log_text

CAPACITY_ERRORS = {"InsufficientInstanceCapacity", "InsufficientCapacity", "SpotMaxPriceTooLow",
                   "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "Unsupported"}
UNREACHABLE_POLLS = 3  # polls in a row AWS may be out of reach for before the launcher stops the run
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")  # an instance that no longer runs the run
ROOT = Path(__file__).resolve().parents[2]  # the project root (pyproject.toml) of a source checkout


class AwsBackend(Backend):
    name = "aws"
    Options = AwsOptions  # the valid options, their defaults and checks (scalelab/aws/options.py)

    def __init__(self, options: dict[str, Any] | None = None, *, session=None,
                 clients: dict[str, Any] | None = None, endpoint_url: str | None = None) -> None:
        super().__init__(options)
        self._session, self._clients, self._endpoint = session, dict(clients or {}), endpoint_url
        self._plan: Plan | None = None
        self._said_local: set[Path] = set()  # runs whose logs were shown from the local copy, AWS failing (`logs`)
        self._missed_polls: dict[Path, int] = {}  # runs: how many polls in a row AWS could not be reached for

    def _forget(self) -> None:
        self._plan = None  # the plan of another run (another instance type)

    # ---- request (pure) --------------------------------------------------------------------------

    def region(self) -> str:
        if self.options["region"]:
            return str(self.options["region"])
        if self._session is not None:
            return self._session.region_name or ""
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise SpecError("the aws backend needs boto3: pip install boto3") from None
        return default_region()  # AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config: no call

    def check(self, spec: Spec) -> None:
        """What needs no remote call: the plan (types, GPUs, bucket, region), the wheel to ship, and a note on
        types the default AMI cannot use; also for --dry-run, which printed a plan AWS would refuse."""
        plan = render.make_plan(spec, Path("runs/validate"), self.options, self.region())
        wheel = str(self.options.get("wheel") or "")
        if wheel and not Path(wheel).is_file():
            raise SpecError(f"--backend-opt wheel={wheel}: no such file; give the path of a built wheel "
                            f"(pip wheel --no-deps -w dist .), or leave it out to ship one built from this checkout")
        types = [*plan.node_types, *(self.options.get("fallback_instance_types") or [])]
        misses = [t for t in render.default_ami_misses(types, str(self.options.get("ami") or "")) if t not in _NOTED]
        if misses:
            _NOTED.update(misses)
            print(f"note: {', '.join(misses)}: not among the types the default AMI supports (AWS Deep Learning AMI "
                  f"PyTorch 2.9: {', '.join(render.DEFAULT_AMI_FAMILIES)}); its PyTorch cannot use that GPU, so "
                  "the run would fail after the boot; pick one of those with --instance-type, or pass --ami with "
                  "an image whose driver and PyTorch support it", file=sys.stderr, flush=True)

    def submit_dryrun(self, spec: Spec, run_dir: Path) -> AwsRequest:
        plan = render.make_plan(spec, run_dir, self.options, self.region())
        return AwsRequest(Path(run_dir), plan, render.all_calls(plan))

    # ---- clients ---------------------------------------------------------------------------------

    def client(self, service: str, region: str):
        if service in self._clients:
            return self._clients[service]
        try:
            import boto3
        except ImportError:
            raise ScalelabError("the aws backend needs boto3: pip install boto3") from None
        session = self._session or boto3.Session(region_name=region)
        if session.get_credentials() is None:
            raise ScalelabError(
                "no AWS credentials found: run `aws configure` (or `aws sso login`), or set AWS_PROFILE, or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; they stay on this machine (instances use --instance-profile)")
        self._clients[service] = session.client(service, region_name=region, endpoint_url=self._endpoint)
        return self._clients[service]

    # ---- schedule --------------------------------------------------------------------------------

    def schedule(self, request: AwsRequest) -> str:
        plan, run_dir = request.plan, Path(request.run_dir)
        self._plan = plan
        # the first request of a launch: an endpoint that cannot be reached, bad keys
        with _one_line("checking for instances of the run", "nothing was started"):
            self._refuse_while_running(plan, run_dir)
        used = _generations_recorded(run_dir)  # before start_state writes a new launch.json over them
        RunPaths(run_dir).logs.mkdir(parents=True, exist_ok=True)
        start_state(run_dir, backend=self.name, run_id=plan.run_id, region=plan.region, bucket=plan.bucket,
                    prefix=plan.prefix, node_types=plan.node_types, started=time.time(), generation=0,
                    instances=[], refs={}, replacements=0, requests=request.calls)
        try:
            ec2, s3 = self.client("ec2", plan.region), self.client("s3", plan.region)
            generation = max([_next_generation(s3, plan), *(g + 1 for g in used | _generations_tagged(ec2, plan.run_id))])
            s3.delete_object(Bucket=plan.bucket, Key=plan.key(STOP_REQUEST))  # a resumed run was cancelled before
            _beat(s3, plan.bucket, plan.prefix, self._heartbeat_timeout_s())
            refs: dict[str, Any] = {}
            for call in request.calls:
                if call["operation"] == "RunInstances":
                    continue
                self._send(call, refs, ec2, s3, run_dir)
                update_state(run_dir, refs=refs)  # what exists is known at once: teardown deletes exactly that
            update_state(run_dir, generation=generation)
            self._launch_generation(run_dir, generation)
        except BaseException as exc:  # the runner records how the launch ended
            started = bool(read_state(run_dir).get("instances"))
            down = self._safe_teardown(run_dir, CANCELLED if isinstance(exc, KeyboardInterrupt) else FAILED)
            if _is_client_error(exc):
                undone = _start_undone(started, down)
                missing = _no_bucket(exc, plan)
                raise (ScalelabError(f"{missing}; {undone}") if missing else
                       _user_error(exc, "starting the run", undone)) from None
            raise
        return plan.run_id

    def _heartbeat_timeout_s(self) -> float:
        return float(self.options["heartbeat_timeout_min"]) * 60

    def _refuse_while_running(self, plan: Plan, run_dir: Path) -> None:
        """One generation at a time: a resume while instances of the run still run is refused.

        That happens after the launcher that followed them was killed: they go on until its heartbeat
        is `heartbeat_timeout_min` old.
        """
        up = td.instances(self.client("ec2", plan.region), plan.run_id, ["pending", "running"])
        if up:
            raise RunBusy(
                f"run {run_dir} still has {len(up)} instance(s) running ({up[0]['InstanceId']}...): its launcher is "
                f"gone and they stop by themselves {self.options['heartbeat_timeout_min']:g} min after its last "
                f"heartbeat; `launch cancel {shell_word(run_dir)}` stops them now (with a checkpoint), then `launch resume {shell_word(run_dir)}`")

    def _send(self, call: dict[str, Any], refs: dict[str, Any], ec2, s3, run_dir: Path) -> dict:
        params = _resolve(call["params"], refs, ec2, self.options)
        if call["service"] == "s3":
            if params["Body"] == render.WHEEL_BODY:
                with self._wheel() as wheel:
                    s3.upload_file(str(wheel), params["Bucket"], params["Key"])
                return {}
            if params["Body"] == render.CODE_BODY:  # a --script's folder: the files the dry run listed
                return s3.put_object(**{**params, "Body": pack_code(Path(call["folder"]), call["files"])})
            return s3.put_object(**{**params, "Body": params["Body"].encode()})
        from botocore import xform_name

        response = getattr(ec2, xform_name(call["operation"]))(**params)
        if call.get("name"):
            refs[call["name"]] = {k: v for k, v in response.items() if k != "ResponseMetadata"}
        return response

    @contextmanager
    def _wheel(self) -> Iterator[Path]:
        """The wheel to ship: --backend-opt wheel=PATH, else one built from this checkout into a
        temporary directory that is removed once the wheel is uploaded (or the build failed), so
        that no launch leaves a `scalelab-wheel-*` directory behind."""
        if self.options["wheel"]:
            path = Path(self.options["wheel"])
            if not path.is_file():
                raise ScalelabError(f"wheel not found: {path} (check --backend-opt wheel=PATH)")
            yield path
            return
        if not (ROOT / "pyproject.toml").is_file():
            raise ScalelabError("cannot build the package to ship: no pyproject.toml beside the aws package; "
                                "pass --backend-opt wheel=PATH (pip wheel --no-deps scalelab)")
        with tempfile.TemporaryDirectory(prefix="scalelab-wheel-") as out:
            proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                                   "-w", out, str(ROOT)], capture_output=True, text=True)
            wheel = Path(out) / render.PACKAGE_NAME
            if proc.returncode or not wheel.is_file():
                raise ScalelabError(f"building the wheel {render.PACKAGE_NAME} of {ROOT} failed: "
                                    f"{proc.stderr.strip()[-500:]}")
            yield wheel

    def _launch_generation(self, run_dir: Path, generation: int) -> None:
        """Start a generation's instances: the planned types, else each fallback type in turn."""
        plan = self._plan_for(run_dir)
        ec2 = self.client("ec2", plan.region)
        refs = read_state(run_dir)["refs"]
        candidates = [plan.node_types] + [[t] * plan.nodes for t in self.options.get("fallback_instance_types") or []]
        errors = []
        for types in candidates:
            try:
                for call in render.run_instances_calls(plan, generation, types):
                    response = ec2.run_instances(**_resolve(call["params"], refs, ec2, self.options))
                    self._record_instances(run_dir, generation, response["Instances"])
                update_state(run_dir, generation=generation, generation_started=time.time(), node_types=types)
                return
            except Exception as exc:
                code = _error_code(exc)
                if code not in CAPACITY_ERRORS:
                    raise
                errors.append(f"{types[0]}: {code}")
                td.terminate(ec2, [i["InstanceId"] for i in td.instances(ec2, plan.run_id, td.LIVE_STATES, generation)])
        raise ScalelabError(f"no EC2 capacity for the run ({'; '.join(errors)}); try another --instance-type, "
                            "--fallback-instance-type, region or --on-demand")

    def _record_instances(self, run_dir: Path, generation: int, instances: list[dict]) -> None:
        with edit_state(run_dir) as info:
            for i in instances:
                info["instances"].append({"id": i["InstanceId"], "type": i["InstanceType"], "generation": generation,
                                          "lifecycle": i.get("InstanceLifecycle", "on-demand"), "launched": time.time()})
        mirror.event(run_dir, "instances_started", generation=generation,
                     instances=[{"id": i["InstanceId"], "type": i["InstanceType"],
                           "lifecycle": i.get("InstanceLifecycle", "on-demand")} for i in instances])

    def _plan_for(self, run_dir: Path) -> Plan:
        """The plan of this run: the one scheduled by this object, else rebuilt from spec.json."""
        if self._plan is None:
            info = read_state(run_dir)
            self._plan = render.make_plan(read_spec(Path(run_dir)), Path(run_dir), self.options, info["region"])
        return self._plan

    # ---- poll ------------------------------------------------------------------------------------

    def poll(self, run_dir: Path) -> RunStatus:
        """Mirror S3 into the run directory, then look at the run (and replace interrupted capacity)."""
        run_dir = Path(run_dir)
        try:
            info = read_state(run_dir)
            _beat(self.client("s3", info["region"]), info["bucket"], info["prefix"],  # "still following"
                  self._heartbeat_timeout_s())
            self.pull(run_dir)
            outcome = self._check(run_dir)
        except Exception as exc:
            if not _is_client_error(exc):
                raise
            return self._aws_failed(run_dir, exc)
        self._missed_polls.pop(run_dir, None)
        return outcome or RunStatus(RUNNING, f"generation {read_state(run_dir)['generation']}")

    def _aws_failed(self, run_dir: Path, exc: BaseException) -> RunStatus:
        """A poll AWS refused or could not be reached for. Out of reach for fewer than UNREACHABLE_POLLS polls in a
        row: the run goes on (a network blip must not end a long run). Else the run is stopped here, and the error
        says what that stop really did. Why: the runner's own stop came after the error's words, which said "every
        instance of the run was terminated" while the stop had failed and the instance ran on (also in launch.json)."""
        missed = self._missed_polls[run_dir] = self._missed_polls.get(run_dir, 0) + 1
        if type(exc).__name__ in UNREACHABLE and missed < UNREACHABLE_POLLS:
            _say(f"warning: cannot reach AWS while following the run ({exc}); trying again "
                 f"({missed} of {UNREACHABLE_POLLS} polls in a row)")
            return RunStatus(RUNNING, f"generation {read_state(run_dir)['generation']}; AWS out of reach")
        self._missed_polls.pop(run_dir, None)
        try:
            self._stop(run_dir, None)
        except Exception as down:
            if not _is_client_error(down):
                raise
            error = _user_error(exc, "following the run", f"stopping the run failed too ({_aws_failure(down)}): its"
                                + self._may_still_run(run_dir, down))
        else:
            error = _user_error(exc, "following the run", "every instance of the run was terminated")
        record_state(run_dir, FAILED, str(error))  # the runner then leaves the run as recorded: not stopped twice
        raise error from None

    def _check(self, run_dir: Path) -> RunStatus | None:
        """One look at the run: None while it goes on, else how it ended (instances still up)."""
        info = read_state(run_dir)
        plan, gen, now = self._plan_for(run_dir), int(info["generation"]), time.time()
        cancel_asked = info.get("state") == CANCELLED  # by `launch cancel` in another process
        waited = self._cancel_waited(run_dir, info, now) if cancel_asked else None
        ec2 = self.client("ec2", plan.region)
        copy = run_dir / mirror.MIRROR_DIR
        statuses = mirror.json_files(copy / "status" / f"gen-{gen}", lambda n: not n.endswith(".heartbeat.json"))
        beats = mirror.json_files(copy / "status" / f"gen-{gen}", lambda n: n.endswith(".heartbeat.json"))
        notices = mirror.json_files(copy / "events" / f"gen-{gen}", lambda n: True)
        nodes = sorted(td.instances(ec2, plan.run_id, None, gen), key=node_order)
        if not nodes:
            return RunStatus(CANCELLED, "cancelled") if cancel_asked else RunStatus(FAILED, f"no instance of generation {gen} exists")
        leader = nodes[0]["InstanceId"]
        lead = statuses.get(leader, {}).get("state")
        unsaid = self._silent_after_the_leader(run_dir, gen, nodes, statuses, now) if lead else []
        if lead == "completed":
            return self._ended(COMPLETED, f"generation {gen} finished on {len(nodes)} instance(s)", unsaid)
        if lead == "cancelled":  # a rank got a stop signal; every rank checkpointed and stopped: no replacement
            return self._ended(CANCELLED, f"a rank of generation {gen} got a stop signal; every rank stopped with a "
                                          f"checkpoint; `launch resume {shell_word(run_dir)}` continues it", unsaid)
        if any(s.get("reason") == LAUNCHER_LOST for s in statuses.values()):
            return self._launcher_lost(run_dir, "was it suspended?")
        failed = {i: s for i, s in statuses.items() if s.get("state") == "failed"}
        if failed:
            return RunStatus(FAILED, "; ".join(f"{i}: {s.get('error') or 'exit code ' + str(s.get('exit_code'))}"
                                                 for i, s in failed.items()))
        gone = [n for n in nodes if n["State"]["Name"] in GONE_STATES
                and statuses.get(n["InstanceId"], {}).get("state") not in ("completed", "cancelled")
                and statuses.get(n["InstanceId"], {}).get("notice_on") in (None, n["InstanceId"])]  # not a peer's
        stopping = notices or gone or lead == "interrupted"
        if cancel_asked or any(s.get("reason") == STOP_REQUESTED for s in statuses.values()) or (
                stopping and self._stop_asked(info)):
            # `launch cancel` from elsewhere: its ranks stopped on the stop request; not an interruption to
            # replace (that started a new generation while the cancel tore the run down, found on two played
            # instances; and again when the cancel's teardown ended the instances before their statuses
            # reached this mirror). Ended once the leader has said it saved (or is gone): the teardown must
            # not cut its checkpoint's upload.
            if lead is None and leader not in {n["InstanceId"] for n in nodes if n["State"]["Name"] in GONE_STATES}:
                if waited is None:  # no cancel recorded, or one seen less than the cancel's own wait ago
                    return None
                return RunStatus(CANCELLED, f"cancelled (`launch cancel`); the leader reported no checkpoint within "
                                            f"{waited:g} s; `launch resume {shell_word(run_dir)}` continues from "
                                            "the last checkpoint in S3")
            return self._ended(CANCELLED, f"cancelled (`launch cancel`); every rank stopped with a checkpoint; "
                                          f"`launch resume {shell_word(run_dir)}` continues it", unsaid)
        outside = [n for n in gone if n.get("InstanceLifecycle") != "spot" and n["InstanceId"] not in notices]
        if outside:  # on-demand capacity is not interrupted by AWS: someone ended it; not replaced
            return self._ended_outside(run_dir, gen, outside)
        if stopping:
            first = info.setdefault("interrupted_at", now)
            update_state(run_dir, interrupted_at=first)
            if lead is None and now - first < float(self.options["interruption_grace_s"]) and leader not in {n["InstanceId"] for n in gone}:
                return None  # the leader is still checkpointing
            if lead and unsaid is None:
                return None  # it has: the others' last records of this generation come with their statuses
            return self._replace(run_dir, gen, nodes, notices, gone)
        silent = [n["InstanceId"] for n in nodes if n["InstanceId"] not in beats and n["InstanceId"] not in statuses]
        started = float(info.get("generation_started", info["started"]))
        if silent and now - started > float(self.options["report_timeout_min"]) * 60:
            return RunStatus(FAILED, f"instance(s) {', '.join(silent)} never reported within "
                                       f"{self.options['report_timeout_min']} min of starting; see their console output "
                                       f"(aws ec2 get-console-output --instance-id {silent[0]})")
        if now - float(info["started"]) > float(self.options["timeout_min"]) * 60:
            return RunStatus(FAILED, f"time limit of {self.options['timeout_min']} min reached (--time-limit-min)")
        return None

    def _cancel_waited(self, run_dir: Path, info: dict, now: float) -> float | None:
        """A run recorded CANCELLED by `launch cancel` in another process while this launcher follows it: None
        while the cancel's own wait for the leader's checkpoint may still run, else that wait (s), after which
        the run ends whatever the leader said. Why: the follower ended the run the moment launch.json said
        CANCELLED, before the cancel had even put its stop request, and tore the instances down while the
        leader was saving (no checkpoint; the cancel then waited 150 s for an instance already gone, and the
        run's aws_end was recorded twice). The stop request is put here too (the cancel may have died before
        it did): the nodes checkpoint and the ordinary stop path below ends the run once the leader has said
        so or is gone."""
        seen = info.get("cancel_seen")
        if seen is None:
            s3 = self.client("s3", info["region"])
            s3.put_object(Bucket=info["bucket"], Key=f"{info['prefix']}/{STOP_REQUEST}", Body=b"cancel")
            seen = update_state(run_dir, cancel_seen=now)["cancel_seen"]
        wait_s = float(self.options["interruption_grace_s"]) + float(self.options["end_grace_s"])
        return wait_s if now - float(seen) >= wait_s else None

    def _silent_after_the_leader(self, run_dir: Path, gen: int, nodes: list[dict], statuses: dict,
                                 now: float) -> list[str] | None:
        """Once the leader has said its last word: None while another instance still up has not said its
        own (for up to `end_grace_s`), else the ids of those that never did (usually none).

        The leader's end is not the run's: another instance uploads its ranks' last records when it sees
        that, a poll or more later, and writes its final status after them (a Horovod follower's rank 1
        records only there). Ending at the leader's word pulled the follower's records before that upload
        and tore it down: a completed Horovod run whose rank 1 had its start record and no step (CI,
        2026-12-04)."""
        waiting = [n["InstanceId"] for n in nodes[1:]
                   if n["InstanceId"] not in statuses and n["State"]["Name"] not in GONE_STATES]
        if not waiting:
            return []
        seen = read_state(run_dir).get("leader_done")  # [generation, when this launcher first saw it]
        if not seen or seen[0] != gen:
            seen = update_state(run_dir, leader_done=[gen, now])["leader_done"]
        return None if now - float(seen[1]) < float(self.options["end_grace_s"]) else waiting

    def _ended(self, state: str, detail: str, silent: list[str] | None) -> RunStatus | None:
        """The run's end once no instance is waited for (see _silent_after_the_leader), said with the silent ones."""
        if silent is None:
            return None
        if silent:
            detail += (f"; instance(s) {', '.join(silent)} sent no final status within {self.options['end_grace_s']:g} s "
                       f"(end_grace_s): their last records may be missing")
        return RunStatus(state, detail)

    def _stop_asked(self, info: dict) -> bool:
        """Whether `launch cancel` put its stop request in S3 (asked before replacing anything: S3 itself,
        not this run directory's mirror, which keeps an earlier cancel's request after a resume)."""
        from botocore.exceptions import ClientError

        try:
            self.client("s3", info["region"]).head_object(Bucket=info["bucket"], Key=f"{info['prefix']}/{STOP_REQUEST}")
        except ClientError as exc:
            if is_missing(exc):
                return False
            raise
        return True

    def _ended_outside(self, run_dir: Path, gen: int, lost: list[dict]) -> RunStatus:
        """The end of a run whose on-demand instance(s) ended outside scalelab (terminated or stopped by hand, or by
        EC2 on a failure), with EC2's reason (StateReason). Why: they were called spot interruptions and replaced,
        four times, then "capacity was interrupted 4 times ... continues from the last checkpoint" with no
        checkpoint at all."""
        for n in lost:
            mirror.event(run_dir, "instance_ended_outside", generation=gen, instance_id=n["InstanceId"],
                         instance_type=n["InstanceType"], state=n["State"]["Name"],
                         reason=(n.get("StateReason") or {}).get("Code"))
        said = "; ".join(f"instance {n['InstanceId']} was {_gone_word(n)} outside scalelab"
                         + (f" ({why})" if (why := (n.get("StateReason") or {}).get("Message")) else "") for n in lost)
        return RunStatus(FAILED, f"{said}; an on-demand instance is not replaced; " + _resume_advice(run_dir))

    def _replace(self, run_dir: Path, gen: int, nodes: list[dict], notices: dict, gone: list[dict]) -> RunStatus | None:
        """Record the interruption, end the generation, start the next one from the checkpoint."""
        ec2 = self.client("ec2", self._plan_for(run_dir).region)
        info = read_state(run_dir)
        last_step = mirror.last_step(mirror.generation_records(run_dir, gen))
        hit = sorted(set(notices) | {n["InstanceId"] for n in gone})
        types = {n["InstanceId"]: n["InstanceType"] for n in nodes}
        for iid in hit:
            mirror.event(run_dir, "spot_interruption", generation=gen, instance_id=iid, instance_type=types.get(iid),
                   notice=(notices.get(iid) or {}).get("notice"), last_step=last_step,
                   interrupted_at=info.get("interrupted_at"))
        td.terminate(ec2, [n["InstanceId"] for n in nodes if n["State"]["Name"] not in ("terminated", "shutting-down")])
        self._mark_ended(run_dir, gen)
        if int(info.get("replacements", 0)) >= int(self.options["max_replacements"]):
            return RunStatus(FAILED, f"capacity was interrupted {info.get('replacements', 0) + 1} times "
                                       f"(max_replacements {self.options['max_replacements']}); "
                                       + _resume_advice(run_dir))
        with edit_state(run_dir) as info:
            info.pop("interrupted_at", None)
            info["replacements"] = int(info.get("replacements", 0)) + 1
        self._launch_generation(run_dir, gen + 1)
        mirror.event(run_dir, "capacity_replaced", generation=gen + 1, instance_types=read_state(run_dir)["node_types"],
                     resume_from_step=mirror.checkpoint_step(run_dir))
        return None

    # ---- mirror S3 into the run directory -----------------------------------------------------

    def pull(self, run_dir: Path) -> None:
        """Mirror the run's S3 prefix into RUN_DIR (see scalelab/aws/mirror.py)."""
        info = read_state(run_dir)
        etags = mirror.pull(self.client("s3", info["region"]), Path(run_dir), info)
        if etags is not None:
            update_state(run_dir, etags=etags)

    # ---- the end -----------------------------------------------------------------------------

    def finish(self, run_dir: Path, status: RunStatus) -> RunStatus:
        """The last records and logs from S3, then everything of the run removed."""
        try:
            self.pull(run_dir)
        finally:
            self._teardown(Path(run_dir), status.state)
        return status

    def _mark_ended(self, run_dir: Path, generation: int | None = None) -> None:
        with edit_state(run_dir) as info:
            for inst in info["instances"]:
                if inst.get("ended") is None and (generation is None or inst["generation"] == generation):
                    inst["ended"] = time.time()

    def _safe_teardown(self, run_dir: Path, state: str) -> bool:
        """Teardown on an error path: a failing teardown must not hide the original error, but is said. Returns
        whether it succeeded (the error then says what was really removed)."""
        if not self._clients and self._session is None:
            try:
                self.client("ec2", read_state(run_dir)["region"])
            except ScalelabError:  # no credentials: nothing can have been created
                return True
        try:
            self._teardown(run_dir, state)
        except Exception as exc:  # noqa: BLE001
            run_id = render.cloud_run_id(run_dir)
            print(f"launch: warning: could not tear down run {run_id} ({exc!r}); "
                  f"run `launch aws gc --run-id {run_id}`", file=sys.stderr)
            return False
        return True

    def _teardown(self, run_dir: Path, state: str) -> list[str]:
        """Whatever happened: terminate every instance of the run, delete its groups, record what went.

        `state` is how the run ended for the cost events; an end the runner recorded already (a
        cancel) wins, as it does in launch.json. Returns the ids of the instances it terminated.
        """
        info = read_state(run_dir)
        region = info["region"]
        created_pgs = [c["params"]["GroupName"] for c in info.get("requests", [])
                       if c["operation"] == "CreatePlacementGroup" and "placement_group" in info.get("refs", {})]
        removed = td.teardown(self.client("ec2", region), info["run_id"], poll_s=min(5.0, float(self.options["poll_s"])),
                              placement_groups=created_pgs, give_up=STOP_NOW.is_set)
        self._mark_ended(run_dir)
        with edit_state(run_dir) as info:  # once per launch: a cancel from elsewhere and the follower both tear down
            first = info.get("torn_down") != info.get("started")
            if first:
                info.update(removed=removed, torn_down=info.get("started"))
        self._beat_ended(info)
        if first:
            state = info["state"] if info.get("state") in TERMINAL else state
            mirror.event(run_dir, "aws_end", state=state, **mirror.cost_facts(run_dir, info))
        return list(removed["instances"])

    def _beat_ended(self, info: dict[str, Any]) -> None:
        """Mark the heartbeat ended: `launch aws gc` may then remove what the teardown kept at once."""
        try:
            _beat(self.client("s3", info["region"]), info["bucket"], info["prefix"], self._heartbeat_timeout_s(),
                  ended=True)
        except Exception:  # noqa: BLE001 - the run is down; gc falls back on the heartbeat's age
            pass

    # ---- status, logs, cancel ------------------------------------------------------------------

    def status(self, run_dir: Path) -> RunStatus:
        """The run's state; AWS's refusal, or an endpoint that cannot be reached, is one line (`_user_error`), as at
        the launch's first request: `launch status`, `launch ls` and a resume's check of the run all ask here, and
        showed botocore's traceback (exit 1)."""
        info = read_state(run_dir)
        if info.get("state") in TERMINAL:
            return RunStatus(info["state"], info.get("detail", ""))
        with _one_line("looking up the run's state", "nothing was changed"):
            live = td.instances(self.client("ec2", info["region"]), info["run_id"], ["pending", "running"])
            if live:
                return RunStatus(RUNNING, f"{len(live)} instance(s) up, generation {info.get('generation')}")
            return self._ended_unfollowed(Path(run_dir), info) or RunStatus(
                UNKNOWN, "no instance is up and the launcher did not record how the run ended")

    def _ended_unfollowed(self, run_dir: Path, info: dict) -> RunStatus | None:
        """How a run no launcher recorded the end of ended, as S3 says: removed by `launch aws gc` (its record,
        control/gc.json), or its instances stopped themselves when the launcher's heartbeat went stale; None
        when S3 says neither. Why: after a killed launcher and `launch aws gc --run-id R --force`, `launch
        status` said UNKNOWN for ever, though gc and the nodes knew how the run had ended."""
        from botocore.exceptions import ClientError

        s3 = self.client("s3", info["region"])
        run = shell_word(run_dir)
        try:
            gc = json.loads(s3.get_object(Bucket=info["bucket"], Key=f"{info['prefix']}/{GC_RECORD}")["Body"].read())
        except (ClientError, ValueError) as exc:
            if isinstance(exc, ClientError) and not is_missing(exc):
                raise
            gc = None
        if isinstance(gc, dict) and isinstance(gc.get("time"), (int, float)) and gc["time"] >= float(info.get("started", 0)):
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(gc["time"]))
            return RunStatus(CANCELLED, f"its instances were removed by `launch aws gc` on {gc.get('host', 'a host')} "
                                        f"at {when}, no launcher following it; `launch resume {run}` continues from the "
                                        "last checkpoint in S3")
        prefix = f"{info['prefix']}/status/gen-{info.get('generation', 0)}/"
        for obj in s3.list_objects_v2(Bucket=info["bucket"], Prefix=prefix).get("Contents", []):
            if obj["Key"].endswith(".heartbeat.json") or not obj["Key"].endswith(".json"):
                continue
            try:
                said = json.loads(s3.get_object(Bucket=info["bucket"], Key=obj["Key"])["Body"].read())
            except (ClientError, ValueError):
                continue
            if isinstance(said, dict) and said.get("reason") == LAUNCHER_LOST:
                return self._launcher_lost(run_dir, "was it killed?")
        return None

    def _launcher_lost(self, run_dir: Path, guess: str) -> RunStatus:
        """A run whose instances stopped themselves on a stale launcher heartbeat (a status of reason LAUNCHER_LOST),
        as the following launcher (`_check`) and `launch status` of an unfollowed run (`_ended_unfollowed`) say it."""
        return RunStatus(FAILED, f"the instances stopped themselves: no heartbeat from the launcher for "
                                 f"{self.options['heartbeat_timeout_min']:g} min ({guess}); "
                                 f"`launch resume {shell_word(run_dir)}` continues from the last checkpoint")

    def logs(self, run_dir: Path) -> str:
        """The nodes' logs, mirrored from S3 first while the run has not ended. Where the mirror cannot be made (no
        credentials, AWS refusing or out of reach) the local copy as of the last mirror is shown; an AWS error
        says so once on stderr, with why. Why: an unreachable endpoint was a 150-line botocore traceback."""
        run_dir = Path(run_dir)
        if read_state(run_dir).get("state") not in TERMINAL:
            try:
                self.pull(run_dir)
            except ScalelabError:
                pass
            except Exception as exc:
                if not _is_client_error(exc):
                    raise
                if run_dir not in self._said_local:  # `launch logs -f` asks on every tick: said once
                    self._said_local.add(run_dir)
                    _say(f"showing the local copy of the logs as of the last mirror ({mirror.mirrored(run_dir).root}): "
                         f"{_aws_failure(exc)}")
        files = _node_logs(run_dir)
        if not files:
            return f"(no logs from the instances yet; {mirror.mirrored(run_dir).logs} is empty)\n"
        return log_text(files)

    def rank_output_files(self, run_dir: Path) -> list[RankOutput]:
        """The nodes' logs as the follow loop mirrors them from S3 (`poll`): torchrun's and horovodrun's lines of
        their ranks, each tagged with its rank; the nodes' own lines are not a rank's."""
        return [RankOutput(path) for path in _node_logs(Path(run_dir))]

    def cancel(self, run_dir: Path, grace_s: float | None = None) -> str | None:
        """Ask the nodes to checkpoint (STOP_REQUEST), wait for the leader where a rank has something to
        save, terminate everything. After a second Ctrl-C (STOP_NOW) nothing is waited for or pulled:
        the instances go at once, and the records stay in S3 for the next `launch report` or resume.

        AWS refusing a request or out of reach is one line, not botocore's traceback: an error (`_still_up`) when the
        teardown failed, as the instances may still run; a warning when only the stop request, the wait or the last
        mirror failed, as they were terminated all the same.

        Returns what it terminated ("terminated 1 instance(s): i-..."), None when no instance was up: `launch cancel`
        of a run recorded ended says "nothing to stop" only then."""
        try:
            terminated = self._stop(Path(run_dir), grace_s)
        except Exception as exc:
            if not _is_client_error(exc):
                raise
            raise self._still_up(Path(run_dir), exc) from None
        return f"terminated {len(terminated)} instance(s): {', '.join(terminated)}" if terminated else None

    def _stop(self, run_dir: Path, grace_s: float | None) -> list[str]:
        """`cancel`'s steps; AWS's error of the teardown raised as it is, so that the caller says it its own way
        (`cancel`: `_still_up`; a poll that lost AWS: `_aws_failed`)."""
        grace_s = float(self.options["interruption_grace_s"]) if grace_s is None else grace_s
        missed: list[tuple[str, BaseException]] = []  # (what was being done, AWS's error) of the steps that failed
        try:
            try:
                _on_aws(missed, "asking its ranks to checkpoint", lambda: self._ask_to_stop(run_dir, grace_s))
            finally:  # whatever S3 said, the last records; not from an endpoint out of reach (another wait for nothing)
                if not STOP_NOW.is_set() and not any(type(exc).__name__ in UNREACHABLE for _, exc in missed):
                    _on_aws(missed, "mirroring its last records and logs", lambda: self.pull(run_dir))
        except BaseException:  # a bug, a signal: nothing of the run may stay up all the same
            self._teardown(run_dir, CANCELLED)
            raise
        terminated = self._teardown(run_dir, CANCELLED)
        if missed:
            info, (doing, exc) = read_state(run_dir), missed[0]
            _say(f"warning: {_user_error(exc, doing, 'its instances were terminated all the same')}; its last records "
                 f"and logs may be only in S3 (s3://{info['bucket']}/{info['prefix']}/)")
        return terminated

    def _still_up(self, run_dir: Path, exc: BaseException) -> BaseException:
        """The one line of a cancel whose teardown AWS refused or could not be reached for: the runner has recorded
        the run CANCELLED already, but its instances may still run; they stop by themselves once the launcher's
        heartbeat is stale, and `launch cancel` again or `launch aws gc` finishes the job."""
        state = read_state(run_dir).get("state")
        said = f"run {shell_word(run_dir)} is recorded {state} here, but its" if state in TERMINAL else "its"
        return _user_error(exc, "terminating the run's instances", said + self._may_still_run(run_dir, exc, "again"))

    def _may_still_run(self, run_dir: Path, exc: BaseException, again: str = "") -> str:
        """' instances may still be running (...); once ..., `launch cancel RUN` or `launch aws gc ...` terminates
        them': what is true, and what removes them, after a teardown that failed on `exc`."""
        info = read_state(run_dir)
        when = "once AWS can be reached" if type(exc).__name__ in UNREACHABLE else "once that is fixed"
        return (f" instances may still be running (they stop by themselves "
                f"{float(self.options['heartbeat_timeout_min']):g} min after the launcher's last heartbeat); "
                f"{when}, `launch cancel {shell_word(run_dir)}`{' ' + again if again else ''} or `launch aws gc --run-id "
                f"{shell_word(info['run_id'])} --region {shell_word(info['region'])}` terminates them")

    def _ask_to_stop(self, run_dir: Path, grace_s: float) -> None:
        """Put the stop request, then wait (up to `grace_s`) for the leader's checkpoint, but only when a
        rank of this generation has recorded something: before that a checkpoint is impossible and the
        wait was minutes of silence (issue 27). What the stop waits for, and how long, is said."""
        info = read_state(run_dir)
        s3, ec2 = self.client("s3", info["region"]), self.client("ec2", info["region"])
        s3.put_object(Bucket=info["bucket"], Key=f"{info['prefix']}/{STOP_REQUEST}", Body=b"cancel")
        gen = info.get("generation", 0)
        up = td.instances(ec2, info["run_id"], ["pending", "running"])
        if not up:
            return  # nothing runs that could save anything (an ended run, `launch cancel` again)
        ranks = _ranks_started(s3, info["bucket"], f"{info['prefix']}/", gen)
        # A node's heartbeat says its agent has started the ranks; their records reach S3 a poll or more
        # later, so a cancel just after the ranks' first steps found no records and cut the checkpoint
        # (a CI run of tests/test_aws_two_instances.py). A running agent answers the request in a poll.
        agents = ranks or _agents_started(s3, info["bucket"], f"{info['prefix']}/", gen)
        if not agents or grace_s <= 0 or STOP_NOW.is_set():
            why = ("no rank has started yet (no records nor node heartbeats in S3), so there is no checkpoint to "
                   "wait for" if not agents else "not waiting for a checkpoint")
            _say(f"stopping run {info['run_id']}: {why}; terminating its {len(up)} instance(s) now")
            return
        whose = f"its {ranks} rank(s)" if ranks else f"the ranks of its {agents} started instance(s)"
        _say(f"stopping run {info['run_id']}: asked {whose} to checkpoint; waiting up to {grace_s:g} s "
             f"(interruption_grace_s) for the leader to save it to S3 and up to {float(self.options['end_grace_s']):g} s more "
             f"(end_grace_s) for the others' last records, then terminating its {len(up)} instance(s); "
             "Ctrl-C again terminates them at once, without the checkpoint")
        leader = min(td.instances(ec2, info["run_id"], None, gen), key=node_order, default=None)
        every_s = min(5.0, float(self.options["poll_s"]))
        said = _final_statuses_of(s3, info, gen, every_s=every_s)
        gone = _gone_of(ec2, leader["InstanceId"] if leader else None, every_s)
        # the leader's final status (not a heartbeat nor another node's): it checkpointed; or the leader is gone
        # (the launcher that follows the run ended it once it had said so): nothing more will come
        if not wait_until(lambda: STOP_NOW.is_set() or (said() & {leader["InstanceId"]} if leader else said()) or gone(),
                          grace_s, interval_s=0.5):
            _say(f"no checkpoint reported within {grace_s:g} s: terminating the instances anyway; "
                 f"`launch resume {shell_word(run_dir)}` continues from the last checkpoint in S3")
            return
        if leader and gone() and not said() & {leader["InstanceId"]}:
            _say(f"the leader's instance {leader['InstanceId']} is gone (ended by the launcher that follows the run, "
                 "or by AWS): not waiting for its checkpoint any longer")
            return
        # then every other instance still up: it writes its final status after its ranks' last records
        def silent() -> set[str]:
            return {i["InstanceId"] for i in td.instances(ec2, info["run_id"], ["pending", "running"], gen)} - said()

        end_grace_s = float(self.options["end_grace_s"])
        if not STOP_NOW.is_set() and not wait_until(lambda: STOP_NOW.is_set() or not silent(), end_grace_s,
                                                    interval_s=min(5.0, float(self.options["poll_s"]))):
            _say(f"the leader saved its checkpoint, but instance(s) {', '.join(sorted(silent()))} sent no final status "
                 f"within {end_grace_s:g} s (end_grace_s): terminating them; their ranks' last records may be missing")


# ---- helpers -------------------------------------------------------------------------------------


def _final_statuses_of(s3, info: dict, gen: int, every_s: float) -> Callable[[], set[str]]:
    """A function giving the ids of the instances of generation `gen` with a final status in S3 (not a
    heartbeat), asking S3 at most every `every_s` (between asks: the last answer)."""
    prefix, last, ids = f"{info['prefix']}/status/gen-{gen}/", [float("-inf")], [set()]

    def said() -> set[str]:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            listing = s3.list_objects_v2(Bucket=info["bucket"], Prefix=prefix).get("Contents", [])
            ids[0] = {o["Key"][len(prefix):].removesuffix(".json") for o in listing
                      if not o["Key"].endswith(".heartbeat.json")}
        return ids[0]

    return said


def _gone_of(ec2, instance_id: str | None, every_s: float) -> Callable[[], bool]:
    """A function saying whether instance `instance_id` no longer runs (GONE_STATES, or not found), asking EC2
    at most every `every_s`; always False without an instance. Why: `launch cancel` waited its whole
    interruption_grace_s (150 s) for the checkpoint of a leader that the launcher following the run had
    already terminated."""
    last, answer = [float("-inf")], [False]

    def gone() -> bool:
        if instance_id is not None and not answer[0] and time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            try:
                found = [i for r in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
                         for i in r["Instances"]]
            except Exception as exc:  # an instance terminated long ago: InvalidInstanceID.NotFound
                if not str(_error_code(exc) or "").endswith("NotFound"):
                    raise
                found = []
            answer[0] = not found or all(i["State"]["Name"] in GONE_STATES for i in found)
        return answer[0]

    return gone


def _beat(s3, bucket: str, prefix: str, timeout_s: float, ended: bool = False) -> None:
    """The launcher's heartbeat: the nodes stop when it has not changed for `heartbeat_timeout_min`.

    It carries that timeout (`timeout_s`) so that `launch aws gc` judges it fresh or stale by the
    run's own setting, and `ended` once the run is torn down, so that gc need not wait for it to age.
    """
    body = {"time": time.time(), "host": socket.gethostname(), "pid": os.getpid(), "timeout_s": timeout_s,
            **({"ended": True} if ended else {})}
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{LAUNCHER_HEARTBEAT}", Body=json.dumps(body).encode())


_NOTED: set[str] = set()  # instance types already noted as unsupported by the default AMI (once per process)


def _say(message: str) -> None:
    """A line for the user on stderr while the launcher stops a run (it may wait, so it says why)."""
    print(f"launch: {message}", file=sys.stderr, flush=True)


def _ranks_started(s3, bucket: str, prefix: str, gen: int) -> int:
    """How many ranks of the generation have records in S3 (rank-R.jsonl; not a rank's error-rank-R.jsonl beside
    it, the same rank): only those can have something to save."""
    return _count(s3, bucket, f"{prefix}records/gen-{gen}/", lambda name: RANK_FILE.fullmatch(name) is not None)


def _agents_started(s3, bucket: str, prefix: str, gen: int) -> int:
    """How many nodes of the generation have a heartbeat in S3: their agents have started the ranks."""
    return _count(s3, bucket, f"{prefix}status/gen-{gen}/", lambda name: name.endswith(".heartbeat.json"))


def _count(s3, bucket: str, prefix: str, keep: Callable[[str], bool]) -> int:
    """How many non-empty objects under `prefix` have a name (after it) that `keep` takes (one listing page: a
    run's few files)."""
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sum(1 for o in listing.get("Contents", []) if keep(o["Key"][len(prefix):]) and o.get("Size", 1) > 0)


def _next_generation(s3, plan: Plan) -> int:
    """0 for a new run; after a `launch resume`, one past the generations already in S3."""
    gens = [-1]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=plan.bucket, Prefix=plan.key("status") + "/"):
        for obj in page.get("Contents", []):
            m = re.search(r"/status/gen-(\d+)/", obj["Key"])
            if m:
                gens.append(int(m.group(1)))
    return max(gens) + 1


def _start_undone(started: bool, down: bool) -> str:
    """What a launch that failed on the way left, as the end of its error: only what happened. Why: a launch that
    failed before any instance said "every instance of the run was terminated"."""
    if not down:
        return "removing what it had created failed (see the warning above)"
    if started:
        return "every instance of the run was terminated"
    return "no instance had been started; what the launch had created was removed"


def _no_bucket(exc: BaseException, plan: Plan) -> str | None:
    """A NoSuchBucket refusal as a line naming the bucket and how to make it; None for any other error."""
    if _error_code(exc) != "NoSuchBucket":
        return None
    return (f"the bucket {plan.bucket} (--bucket) does not exist: create it with "
            f"`aws s3 mb s3://{plan.bucket} --region {plan.region}`, or pass --bucket with one of yours")


def _gone_word(node: dict) -> str:
    """'terminated' or 'stopped', as EC2 says the instance went."""
    return "stopped" if node["State"]["Name"] in ("stopping", "stopped") else "terminated"


def _resume_advice(run_dir: Path) -> str:
    """What continues the run: `launch resume` from the checkpoint the mirror holds, else the advice for a run
    with none (`no_checkpoint_advice`); never a checkpoint that does not exist."""
    from scalelab.launcher.backend import has_checkpoint, no_checkpoint_advice

    step = mirror.checkpoint_step(run_dir)
    if step is None and not has_checkpoint(run_dir):
        return no_checkpoint_advice(run_dir)
    at = f" of step {step}" if step is not None else ""
    return f"`launch resume {shell_word(run_dir)}` continues from the last checkpoint{at}"


def _generations_recorded(run_dir: Path) -> set[int]:
    """The generations of the instances an earlier launch of the run recorded in its launch.json (none for a new
    run). Why: a resume counted only the generations whose nodes had written a status to S3; after instances that
    never reported, it launched generation 0 again and took the earlier launch's ended ones for its own."""
    try:
        info = read_state(run_dir) if RunPaths(run_dir).launch.exists() else {}
    except (ScalelabError, OSError, ValueError):
        return set()
    return {int(i["generation"]) for i in info.get("instances") or [] if isinstance(i.get("generation"), int)}


def _generations_tagged(ec2, run_id: str) -> set[int]:
    """The generations EC2 still lists instances of for the run (terminated ones stay visible about an hour)."""
    tags = ({t["Key"]: t["Value"] for t in i.get("Tags") or []} for i in td.instances(ec2, run_id))
    return {int(t[render.TAG_GENERATION]) for t in tags if str(t.get(render.TAG_GENERATION, "")).isdigit()}


def _resolve(value: Any, refs: dict[str, Any], ec2, options: dict[str, Any]) -> Any:
    """Fill in `$ref:` values from earlier responses (see scalelab/aws/render.py)."""
    if isinstance(value, dict):
        return {k: _resolve(v, refs, ec2, options) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, refs, ec2, options) for v in value]
    if isinstance(value, str) and value.startswith("$ref:"):
        ref = value[5:]
        if ref == "vpc_of_subnet":
            return ec2.describe_subnets(SubnetIds=[options["subnet_id"]])["Subnets"][0]["VpcId"]
        name, _, key = ref.partition(".")
        return refs[name][key]
    return value


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return (response or {}).get("Error", {}).get("Code") if isinstance(response, dict) else None


UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError")


def _is_client_error(exc: BaseException) -> bool:
    return _error_code(exc) is not None or type(exc).__name__ in ("NoCredentialsError", "NoRegionError", *UNREACHABLE)


@contextmanager
def _one_line(doing: str, outcome: str = "every instance of the run was terminated") -> Iterator[None]:
    """AWS refusing a request of the block, or out of reach, as one line (`_user_error`: what was being done, AWS's
    words, `outcome`) instead of botocore's traceback; any other error as it is."""
    try:
        yield
    except Exception as exc:
        if _is_client_error(exc):
            raise _user_error(exc, doing, outcome) from None
        raise


def _user_error(exc: BaseException, doing: str,
                outcome: str = "every instance of the run was terminated") -> BaseException:
    """AWS's answer as one line: the operation, the error code and AWS's message."""
    if not _is_client_error(exc):
        return exc
    if type(exc).__name__ == "NoCredentialsError":
        return ScalelabError("no AWS credentials found: run `aws configure`, or set AWS_PROFILE or "
                             "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
    if type(exc).__name__ in UNREACHABLE:  # botocore's words name the endpoint: one line, not 158 of traceback
        return ScalelabError(f"cannot reach AWS while {doing}: {exc}; check the network, the region and "
                             f"AWS_ENDPOINT_URL if set; {outcome}")
    return ScalelabError(f"AWS refused {_operation(exc)} while {doing}: {_refusal(exc)}; {outcome}")


def _operation(exc: BaseException) -> str:
    """The request a botocore error is about ('PutObject'), else 'a request'."""
    return getattr(exc, "operation_name", "") or "a request"


def _refusal(exc: BaseException) -> str:
    """AWS's error code and message ('AccessDenied: Access Denied'), else botocore's words."""
    err = getattr(exc, "response", {}).get("Error", {}) if _error_code(exc) else {}
    return f"{err.get('Code')}: {err.get('Message')}" if err else str(exc)


def _aws_failure(exc: BaseException) -> str:
    """Why AWS could not answer, in a few words, for a line that goes on (`logs`); `_user_error` for one that ends."""
    if type(exc).__name__ == "NoCredentialsError":
        return "no AWS credentials found"
    if type(exc).__name__ in UNREACHABLE:
        return f"AWS could not be reached ({exc})"
    return f"AWS refused {_operation(exc)} ({_refusal(exc)})"


def _on_aws(missed: list[tuple[str, BaseException]], doing: str, step: Callable[[], object]) -> None:
    """Run one step of a cancel; AWS's refusal or an unreachable endpoint is added to `missed` (with `doing`) rather
    than raised, so that the teardown after it still runs and says it once; anything else propagates."""
    try:
        step()
    except Exception as exc:
        if not _is_client_error(exc):
            raise
        missed.append((doing, exc))


def pack_code(folder: Path, files: list[str]) -> bytes:
    """A tar.gz of `files` (paths inside `folder`), as `--script`'s folder is shipped through the bucket."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in files:
            tar.add(str(folder / rel), arcname=rel, recursive=False)
    return buf.getvalue()


def _node_logs(run_dir: Path) -> list[Path]:
    """The nodes' log files mirrored into the run directory, in name order."""
    logs = mirror.mirrored(run_dir).logs
    return sorted(p for p in logs.rglob("*.log") if p.is_file()) if logs.is_dir() else []
