"""Streaming batches and the ``captcha-tasks batch`` CLI, end to end: real Redis, two real
worker processes and the sandbox."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from image_files import png_b64

from captcha_tasks.batch import stream
from captcha_tasks.core.outcome import parse_iso
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/batch"
# A killed worker's messages come back within seconds; the sandbox answers at once, so
# short HTTP timeouts (which the visibility timeout must exceed) cost nothing.  The
# settings of the whole module, this process's too: how long a solve message may take to
# start before housekeeping sends it again follows the visibility timeout of the process
# that sent it (a message a worker took off the queue and died with before noting it).
MODULE_ENV = {
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "6",
    "CAPTCHAAI_CONNECT_TIMEOUT": "1",
    "CAPTCHAAI_READ_TIMEOUT": "3",
}


@pytest.fixture
def two_workers(start_worker: Any, clean_state: None) -> list[Any]:
    return [start_worker(concurrency=16, name=f"batch-w{n}") for n in range(2)]


def task(**extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, **extra}


def run_cli(*args: str, env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "captcha_tasks.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, **kwargs)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_results_stream_in_completion_order(sandbox: Any, two_workers: list[Any]) -> None:
    sandbox.configure(solve_time=0.6, jitter=0.5)
    n = 30
    results = list(stream([task() for _ in range(n)]))
    order = [r["index"] for r in results]
    assert sorted(order) == list(range(n))
    assert order != list(range(n))
    assert all(r["status"] == "solved" for r in results)
    assert len({r["token"] for r in results}) == n


def test_a_failed_task_does_not_stop_the_stream(sandbox: Any, two_workers: list[Any]) -> None:
    tasks = [task(), task(proxy="u:p@bad-proxy.test:3128"), task(pageurl="nope"), task()]
    results = {r["index"]: r for r in stream(tasks)}
    assert sorted(results) == [0, 1, 2, 3]
    assert results[1]["status"] == "failed"
    assert results[1]["error"] == "ERROR_PROXY_CONNECTION_FAILED"
    assert results[2]["error"] == "ERROR_VALIDATION"
    assert results[0]["status"] == results[3]["status"] == "solved"


def test_worker_killed_mid_batch_still_yields_every_index(
    sandbox: Any, two_workers: list[Any]
) -> None:
    sandbox.configure(solve_time=0.5, jitter=0.2)
    n = 60
    seen: list[int] = []
    for result in stream([task() for _ in range(n)], timeout_per_task=60):
        seen.append(result["index"])
        if len(seen) == 15:
            two_workers[0].kill()
        assert result["status"] == "solved", result
    assert sorted(seen) == list(range(n))


def test_cli_batch_writes_jsonl_then_resume_runs_only_unsolved(
    sandbox: Any, two_workers: list[Any], tmp_path: Path, env: dict[str, str]
) -> None:
    rows = [task(sitekey=f"k{i}") for i in range(8)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    # a previous run solved 0, 2 and 5, failed 3 and never reported the rest
    write_jsonl(
        out,
        [
            {"index": 0, "status": "solved", "token": "t0"},
            {"index": 2, "status": "solved", "token": "t2"},
            {"index": 3, "status": "failed", "error": "ERROR_CAPTCHA_UNSOLVABLE"},
            {"index": 5, "status": "solved", "token": "t5"},
        ],
    )
    proc = run_cli("batch", str(source), "--resume", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    lines = read_jsonl(out)
    new = lines[4:]
    assert sorted(line["index"] for line in new) == [1, 3, 4, 6, 7]
    assert all(line["status"] == "solved" and line["source"] == "api" for line in new)
    # the result's shape: its method, when it was solved and until when it may be used
    for line in new:
        assert line["method"] == "turnstile", line
        assert parse_iso(line["solved_at"]) < parse_iso(line["expires_at"]), line
        # the site the router used, for a report per site
        assert line["site"] == f"example.com#k{line['index']}", line
    assert sandbox.stats()["submits"] == 5
    assert "5 solved, 0 failed" in proc.stderr


def test_cli_batch_csv_in_and_out(
    sandbox: Any, two_workers: list[Any], tmp_path: Path, env: dict[str, str]
) -> None:
    source = tmp_path / "in.csv"
    source.write_text(
        "method,sitekey,pageurl,action\n"
        f"turnstile,k1,{PAGE},login\n"
        f"userrecaptcha,k2,{PAGE},\n"
        f"turnstile,k3,{PAGE},\n"
    )
    out = tmp_path / "out.csv"
    proc = run_cli("batch", str(source), "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    header, *body = out.read_text().splitlines()
    assert header.split(",")[:3] == ["index", "status", "token"]
    assert header.split(",")[-4:] == ["method", "solved_at", "expires_at", "site"]
    assert sorted(int(line.split(",")[0]) for line in body) == [0, 1, 2]
    with out.open(newline="") as fh:
        rows = {int(r["index"]): r for r in csv.DictReader(fh)}
    assert [rows[i]["method"] for i in range(3)] == ["turnstile", "userrecaptcha", "turnstile"]
    assert all(parse_iso(r["solved_at"]) < parse_iso(r["expires_at"]) for r in rows.values())
    assert [rows[i]["site"] for i in range(3)] == [f"example.com#k{i + 1}" for i in range(3)]


CAPTCHAAI_ROWS: list[dict[str, Any]] = [
    {"method": "cloudflare_challenge", "pageurl": PAGE, "proxy": "u:p@10.0.0.1:3128"},
    {"method": "grid", "body": png_b64(), "instructions": "bus", "grid_size": "3x3"},
    {"method": "friendly_captcha", "sitekey": "FCMG", "pageurl": PAGE},
    {"method": "lemin", "sitekey": "CROPPED_x", "pageurl": PAGE, "div_id": "lemin-box"},
]


def _check_captchaai_results(rows: list[dict[str, Any]], sandbox: Any) -> None:
    by_index = {int(r["index"]): r for r in rows}
    assert sorted(by_index) == list(range(len(CAPTCHAAI_ROWS)))
    assert all(r["status"] == "solved" for r in rows), rows
    assert by_index[0]["user_agent"].startswith("Mozilla/5.0")
    assert sandbox.verify(by_index[0]["token"])["success"] is True
    assert isinstance(by_index[1]["token"], list) and by_index[1]["token"]
    assert not by_index[2].get("user_agent")
    assert set(by_index[3]["token"]) == {"answer", "challenge_uuid"}


def test_cli_batch_captchaai_methods_jsonl(
    sandbox: Any, two_workers: list[Any], tmp_path: Path, env: dict[str, str]
) -> None:
    bls = {"method": "bls", "images": [png_b64() for _ in range(9)], "instructions": "cars"}
    source = write_jsonl(tmp_path / "in.jsonl", [*CAPTCHAAI_ROWS, bls])
    out = tmp_path / "out.jsonl"
    proc = run_cli("batch", str(source), "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out)
    _check_captchaai_results([r for r in rows if r["index"] < len(CAPTCHAAI_ROWS)], sandbox)
    (bls_row,) = [r for r in rows if r["index"] == len(CAPTCHAAI_ROWS)]
    assert isinstance(bls_row["token"], list) and bls_row["token"]


def test_cli_batch_captchaai_methods_csv(
    sandbox: Any, two_workers: list[Any], tmp_path: Path, env: dict[str, str]
) -> None:
    source = tmp_path / "in.csv"
    names = sorted({name for row in CAPTCHAAI_ROWS for name in row})
    with open(source, "w", newline="") as fh:
        writer = csv.DictWriter(fh, names)
        writer.writeheader()
        writer.writerows(CAPTCHAAI_ROWS)
    out = tmp_path / "out.csv"
    proc = run_cli("batch", str(source), "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:  # structured tokens are JSON in their cell
        if row["token"].startswith(("[", "{")):
            row["token"] = json.loads(row["token"])
    _check_captchaai_results(rows, sandbox)


@pytest.mark.parametrize(
    ("name", "content", "bad_lines"),
    [
        (
            "in.jsonl",
            "\n".join(
                [
                    json.dumps(task()),
                    "{not json",
                    json.dumps({"method": "turnstile", "pageurl": PAGE}),
                    json.dumps(task(method="nope")),
                    json.dumps(task()),
                ]
            ),
            [2, 3, 4],
        ),
        (
            "in.csv",
            f"method,sitekey,pageurl\nturnstile,k,{PAGE}\nturnstile,k\nnope,k,{PAGE}\n"
            f"turnstile,,{PAGE}\n",
            [3, 4, 5],
        ),
    ],
)
def test_bad_input_is_rejected_before_anything_is_submitted(
    sandbox: Any, tmp_path: Path, name: str, content: str, bad_lines: list[int], env: dict[str, str]
) -> None:
    source = tmp_path / name
    source.write_text(content)
    proc = run_cli("batch", str(source), "-o", str(tmp_path / "out.jsonl"), env=env)
    assert proc.returncode == 2
    reported = [line for line in proc.stderr.splitlines() if ": line " in line]
    assert [int(r.split(": line ")[1].split(":")[0]) for r in reported] == bad_lines
    assert sandbox.stats()["submits"] == 0
    assert not (tmp_path / "out.jsonl").exists()


def test_unwritable_output_fails_before_submitting(
    sandbox: Any, tmp_path: Path, env: dict[str, str]
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [task()])
    proc = run_cli("batch", str(source), "-o", str(tmp_path / "missing-dir" / "out.jsonl"), env=env)
    assert proc.returncode == 1
    assert "cannot write" in proc.stderr
    assert sandbox.stats()["submits"] == 0


def test_ctrl_c_keeps_lines_and_prints_how_to_resume(
    sandbox: Any, two_workers: list[Any], tmp_path: Path, env: dict[str, str]
) -> None:
    sandbox.configure(solve_time=0.4, jitter=0.1, threads=3)
    source = write_jsonl(tmp_path / "in.jsonl", [task(sitekey=f"k{i}") for i in range(60)])
    out = tmp_path / "out.jsonl"
    # -X faulthandler: a batch still running 30 s after Ctrl-C dumps its threads on SIGABRT
    # (a CI run saw one; what it waited for is what the next failure will show)
    cmd = [sys.executable, "-X", "faulthandler", "-m", "captcha_tasks.cli", "batch", str(source)]
    proc = subprocess.Popen([*cmd, "-o", str(out)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: out.exists() and len(read_jsonl(out)) >= 3, 60, what="some results")
        # The latch: no further answer until the batch has been interrupted, so it cannot
        # end on its own first, however slowly this process is scheduled.
        sandbox.configure(hold=True)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"the batch ran on 30 s after Ctrl-C; its threads then:\n{err[-8000:]}")
    finally:
        sandbox.configure(hold=False)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert f"--resume {out}" in err
    written = read_jsonl(out)  # every line parses: nothing half-written
    assert 3 <= len(written) < 60
    stopped_at = sandbox.stats()["submits"]
    limiter = app.runtime().state.limiter
    wait_until(lambda: limiter.in_use() == 0, 15, what="in-flight captchas to finish")
    assert sandbox.stats()["submits"] == stopped_at


# -- what a new user's input looks like ------------------------------------------------------


def test_a_csv_file_with_another_name_is_explained_in_one_line(
    sandbox: Any, tmp_path: Path, env: dict[str, str]
) -> None:
    source = tmp_path / "tasks.txt"  # CSV content, saved under a name that means JSON lines
    source.write_text("method,sitekey,pageurl\n" + f"turnstile,k,{PAGE}\n" * 20)
    proc = run_cli("batch", str(source), "-o", str(tmp_path / "out.jsonl"), env=env)
    assert proc.returncode == 2
    first, summary = proc.stderr.strip().splitlines()
    assert "looks like a CSV header" in first and "rename it to .csv" in first
    assert summary == "1 bad line(s); nothing was submitted"
    assert sandbox.stats()["submits"] == 0


def test_resume_with_everything_solved_says_so(
    sandbox: Any, tmp_path: Path, env: dict[str, str]
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [task(sitekey=f"k{i}") for i in range(3)])
    out = write_jsonl(
        tmp_path / "out.jsonl",
        [{"index": i, "status": "solved", "token": f"t{i}"} for i in range(3)],
    )
    proc = run_cli("batch", str(source), "--resume", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == f"all 3 tasks of {source} are already solved in {out}"
    assert len(read_jsonl(out)) == 3
    assert sandbox.stats()["submits"] == 0
