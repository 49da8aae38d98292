"""`kubeon-gpu simulate --capacity` end to end on a small slice of the openb trace, checked independently."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cli.main import main
from tests.capacity.events_checker import check

VENDOR = Path(__file__).resolve().parents[2] / "vendor" / "openb"
NODES = VENDOR / "openb_node_list_gpu_node.csv"
INSTANCES = VENDOR / "instances.csv"


def small_trace(path: Path, count: int) -> Path:
    with open(VENDOR / "openb_pod_list_default.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for _, r in zip(range(count), reader, strict=False)]
        header = reader.fieldnames or []
    with open(path, "w", newline="") as fh:
        out = csv.DictWriter(fh, header)
        out.writeheader()
        out.writerows(rows)
    return path


def test_events_replay_to_the_printed_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = small_trace(tmp_path / "pods.csv", 60)
    events = tmp_path / "events.csv"
    code = main(["simulate", "--capacity", "--nodes", str(NODES), "--pods", str(pods), "--instances",
                 str(INSTANCES), "--compress", "50", "--seed", "1", "--events", str(events), "--workers", "1"])
    assert code == 0
    line = json.loads(capsys.readouterr().out)
    assert set(line["strategies"]) == {"cluster-autoscaler", "karpenter", "lower-bound", "kubeon"}
    kubeon = line["strategies"]["kubeon"]
    figures = check(events, pods, INSTANCES, 50.0)
    assert figures["pods_finished"] == 60 and figures["pods_never_placed"] == kubeon["pods_never_placed"] == 0
    for key in ("gpu_node_hours", "node_hours", "cost", "pending_seconds_p50", "pending_seconds_p95"):
        assert figures[key] == pytest.approx(kubeon[key], abs=0.15), key
    for key in ("evictions", "max_evictions_per_pod", "peak_nodes"):
        assert figures[key] == kubeon[key], key
    lower = line["strategies"]["lower-bound"]
    for name in ("cluster-autoscaler", "karpenter", "kubeon"):
        assert line["strategies"][name]["gpu_node_hours"] >= lower["gpu_node_hours"], name
        assert line["strategies"][name]["cost"] >= lower["cost"], name


def test_the_checker_catches_a_broken_run(tmp_path: Path) -> None:
    pods = small_trace(tmp_path / "pods.csv", 2)
    head = "time,event,node,instance_type,pod,gpus\n"
    launch = "0.000,launch,n1,openb-t4-4g-96c-384gi,,\n"
    early = launch + "10.000,place,n1,openb-t4-4g-96c-384gi,openb-pod-0000,0:1000\n"
    (tmp_path / "early.csv").write_text(head + early)
    with pytest.raises(AssertionError, match="before ready"):
        check(tmp_path / "early.csv", pods, INSTANCES, 50.0)
    short = (launch + "180.000,ready,n1,openb-t4-4g-96c-384gi,,\n"
             "180.000,place,n1,openb-t4-4g-96c-384gi,openb-pod-0000,0:1000\n"
             "200.000,finish,n1,openb-t4-4g-96c-384gi,openb-pod-0000,\n"
             "210.000,delete,n1,openb-t4-4g-96c-384gi,,\n")
    (tmp_path / "short.csv").write_text(head + short)
    with pytest.raises(AssertionError, match=r"ran 20\.0 s"):
        check(tmp_path / "short.csv", pods, INSTANCES, 50.0)
    crowded = (launch + "180.000,ready,n1,openb-t4-4g-96c-384gi,,\n"
               "180.000,place,n1,openb-t4-4g-96c-384gi,openb-pod-0000,0:1000\n"
               "180.000,place,n1,openb-t4-4g-96c-384gi,openb-pod-0001,0:460\n")
    (tmp_path / "crowded.csv").write_text(head + crowded)
    with pytest.raises(AssertionError, match="over capacity"):
        check(tmp_path / "crowded.csv", pods, INSTANCES, 50.0)


@pytest.mark.parametrize(("change", "message"), [
    ({"--instances": None}, "--capacity needs --instances"),
    ({"--compress": "0"}, "--compress must be positive"),
    ({"--instances": "BAD"}, "field 'gpus' is not an integer"),
    ({"--pods": "NOTIME"}, "missing column 'creation_time'"),
    ({"--compress": "1e9"}, "--compress must be positive, from 0.001 to 1e+06, got 1000000000.0"),
    ({"--compress": "nan"}, "--compress must be positive"),
    ({"--delay": "nan"}, "--delay must be from 0 to 86400 seconds, got nan"),
    ({"--delay": "1e12"}, "--delay must be from 0 to 86400 seconds"),
    ({"--pods": "INF"}, "inf.csv:2: column 'deletion_time' is not a finite number: 'inf'"),
    ({"--pods": "LONG"}, "long.csv:2: column 'deletion_time' is more than 1e+08 s after creation_time"),
    ({"--pods": "LATE"}, "late.csv:2: column 'creation_time' is above 1e+10 s"),
    ({"--instances": "HUGE"}, "field 'gpus' is above 256"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          change: dict[str, str | None], message: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("instance_type,model,gpus,cpu_milli,memory_mib,price_per_hour\nx,T4,two,1000,1000,1\n")
    notime = tmp_path / "notime.csv"
    notime.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1000,1,1000\n")
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
    files = {"BAD": bad, "NOTIME": notime}
    for name, times in (("INF", "0,inf"), ("LONG", "0,1e9"), ("LATE", "1e11,1e11")):
        files[name] = tmp_path / f"{name.lower()}.csv"
        files[name].write_text(header + f"p,1000,1000,1,1000,{times}\n")
    files["HUGE"] = tmp_path / "huge.csv"
    files["HUGE"].write_text("instance_type,model,gpus,cpu_milli,memory_mib,price_per_hour\nx,T4,1000,1000,1000,1\n")
    args = {"--nodes": str(NODES), "--pods": str(small_trace(tmp_path / "p.csv", 5)),
            "--instances": str(INSTANCES), "--compress": "50"}
    for key, value in change.items():
        if value is None:
            del args[key]
        else:
            args[key] = str(files[value]) if value in files else value
    argv = ["simulate", "--capacity"] + [x for kv in args.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_workers_below_one_is_a_usage_error(workers: str) -> None:
    """It was taken as 1 without a word."""
    from tests.cli.helpers import subprocess_run

    run = subprocess_run("simulate", "--capacity", "--workers", workers, timeout=60)
    assert run.code == 2 and run.err.strip().splitlines()[-1] == \
        f"kubeon-gpu simulate: error: argument --workers: {workers} is below 1", run.err


def test_an_unknown_evicted_work_rule_is_a_usage_error_naming_the_choices() -> None:
    from tests.cli.helpers import subprocess_run

    run = subprocess_run("simulate", "--capacity", "--evicted-work", "checkpoint", timeout=60)
    last = run.err.strip().splitlines()[-1].replace("'resume'", "resume").replace("'restart'", "restart")
    assert run.code == 2 and last == ("kubeon-gpu simulate: error: argument --evicted-work: invalid choice: "
                                      "'checkpoint' (choose from resume, restart)"), run.err


def test_restarted_work_is_checked_as_restarted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--evicted-work restart` on the CLI: its JSON says so and kubeon's events pass the checker's restart rule."""
    pods = small_trace(tmp_path / "pods.csv", 60)
    events = tmp_path / "events.csv"
    code = main(["simulate", "--capacity", "--nodes", str(NODES), "--pods", str(pods), "--instances",
                 str(INSTANCES), "--compress", "50", "--seed", "1", "--events", str(events), "--workers", "1",
                 "--evicted-work", "restart"])
    assert code == 0
    line = json.loads(capsys.readouterr().out)
    assert line["evicted_work"] == "restart"
    figures = check(events, pods, INSTANCES, 50.0, evicted_work="restart")
    assert figures["pods_finished"] == 60
    assert figures["gpu_node_hours"] == pytest.approx(line["strategies"]["kubeon"]["gpu_node_hours"], abs=0.15)
