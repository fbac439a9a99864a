"""The portal's two figures (issue 35): how long a new person takes from signing
up to a first answer, and what mounting the portal costs the gateway.

    python -m benchmarks.portal                # both (about 4 minutes on 2 cores)
    python -m benchmarks.portal --signup-only  # the sign-up flow, --rounds N accounts
    python -m benchmarks.portal --gateway-only # the zero-delay cells, portal off and on
    python -m benchmarks.portal --instructions 300  # the same two under callgrind, counted

**Sign-up to first answer**: a real main (``letsinfer up`` on a temporary home,
the embedded tiny model, loopback ports), driven with httpx as a browser
would: the sign-up form, ``letsinfer user approve NAME --project P`` (the
administrator's command, a fresh interpreter as typed), the sign-in form, a
key made on the keys page, then the playground's streamed answer through the
real gateway with that key. Each step is timed; the total is the sum. The
project exists beforehand (an administrator's one-time setup, not timed).

**Portal off and on**: the zero-delay harness of ``benchmarks/gateway.py``
(the mock sends every token at once, so a request costs what the gateway
costs), with two gateways as a main runs them (records, facts, everything
of issue 16 configured): ``letsinfer-off`` without the portal, ``letsinfer``
with it mounted (``benchmarks/portal_gateway.py``), its pages loaded once
before the cells. They are measured A-B-B-A per cell; the ratios on/off
are printed from this one run. On a shared machine those timings swing by
more than the portal could cost; ``--instructions N`` counts instructions
per request of the same two under callgrind instead (benchmarks/instructions.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks import gateway, instructions
from benchmarks.processes import free_port

LETSINFER = str(Path(sys.executable).parent / "letsinfer")
PASSWORD = "correct horse battery staple"
STEPS = ("sign up", "user approve (CLI)", "sign in", "create key", "first answer")


def csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    if found is None:
        raise SystemExit(f"no CSRF token on {page.url} ({page.status_code})")
    return found.group(1)


def expect(answer: httpx.Response, status: int, step: str) -> httpx.Response:
    if answer.status_code != status:
        raise SystemExit(f"{step}: {answer.status_code} {answer.text[:300]}")
    return answer


class Main:
    """``letsinfer up`` on a temporary home, every plane on loopback."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        env = {
            **os.environ,
            "LETSINFER_GATEWAY__HOST": "127.0.0.1",
            "LETSINFER_CONTROL__HOST": "127.0.0.1",
            "LETSINFER_CONTROL__PORT": str(free_port()),
            "LETSINFER_AGENT__API_HOST": "127.0.0.1",
            "LETSINFER_AGENT__API_PORT": str(free_port()),
            "LETSINFER_GATEWAY__METRICS_PORT": "0",
            "LETSINFER_DISCOVERY__ENABLED": "false",
        }
        argv = [LETSINFER, "--home", str(home), "up", "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(
            [*argv, "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=(home.parent / "main.log").open("w"),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180) -> None:
        """Until the tiny model answers /health as ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the main exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise SystemExit("the main did not become ready")

    def cli(self, *args: str) -> None:
        done = subprocess.run(
            [LETSINFER, "--home", str(self.home), *args], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"letsinfer {' '.join(args)}: {done.stderr.strip()}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def first_answer_flow(main: Main, name: str, project: str) -> dict[str, float]:
    """One person's way from the sign-up form to the playground's last byte:
    seconds per step."""
    took: dict[str, float] = {}
    with httpx.Client(base_url=main.url + "/ui", timeout=300) as browser:
        started = time.perf_counter()
        form = {"name": name, "password": PASSWORD}
        expect(browser.post("/signup", data={"csrf": csrf(browser.get("/signup")), **form}),
               201, "sign up")  # fmt: skip
        took["sign up"] = time.perf_counter() - started

        started = time.perf_counter()
        main.cli("user", "approve", name, "--project", project)
        took["user approve (CLI)"] = time.perf_counter() - started

        started = time.perf_counter()
        expect(browser.post("/signin", data={"csrf": csrf(browser.get("/signin")), **form}),
               303, "sign in")  # fmt: skip
        took["sign in"] = time.perf_counter() - started

        started = time.perf_counter()
        made = expect(
            browser.post("/keys", data={"csrf": csrf(browser.get("/keys")), "label": "first"}),
            201,
            "create key",
        )
        secret = re.search(r'<output id="secret">([^<]+)</output>', made.text)
        if secret is None:
            raise SystemExit("create key: no secret on the page")
        took["create key"] = time.perf_counter() - started

        started = time.perf_counter()
        page = browser.get("/playground")
        asked = {"csrf": csrf(page), "key": secret.group(1), "model": "tiny", "prompt": "Hello"}
        with browser.stream("POST", "/playground", data=asked) as answer:
            expect(answer, 200, "first answer")
            text = "".join(answer.iter_text())
        if 'class="error"' in text:
            raise SystemExit(f"first answer: the playground showed an error: {text[-500:]}")
        took["first answer"] = time.perf_counter() - started
    return took


def signup_figures(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="letsinfer-bench-portal-") as tmp:
        main = Main(Path(tmp) / "home")
        try:
            main.wait_ready()
            main.cli("project", "create", "bench")
            runs = [first_answer_flow(main, f"person{i}", "bench") for i in range(rounds)]
        finally:
            main.stop()
    print(f"\nsign-up to first answer ({rounds} accounts, one after another; seconds):")
    print(f"{'step':22} {'median':>8} {'fastest':>8} {'slowest':>8}")
    for step in (*STEPS, "total"):
        samples = sorted(sum(r.values()) if step == "total" else r[step] for r in runs)
        print(f"{step:22} {statistics.median(samples):8.3f} {samples[0]:8.3f} {samples[-1]:8.3f}")


def gateway_figures(short: bool) -> None:
    plan = gateway.ZERO
    if short:
        plan = gateway.Plan((1, 20), {1: 2000, 20: 4000}, 1.0, tokens=4, interval_ms=0.0)
    gateway.install_uvloop()
    print(
        f"\ngateway, zero delay: portal off (letsinfer-off) and on (letsinfer), "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="letsinfer-bench-portal-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        mock = gateway.start_mock(work, plan)
        stack.callback(mock.stop)
        targets = [gateway.Target("direct", mock.url, server=mock)]
        for name, module in (
            ("letsinfer-off", "benchmarks.letsinfer_gateway"),
            ("letsinfer", "benchmarks.portal_gateway"),
        ):
            flags = gateway.as_a_main(work, name)
            targets.append(
                gateway.start_gateway(name, work, mock.url, stack, *flags, module=module)
            )
        on = targets[-1].url + "/ui/signin"  # the portal's pages loaded, as a main's are
        expect(httpx.get(on, timeout=10), 200, "the portal's sign-in page")
        expect(httpx.get(targets[1].url + "/ui/signin", timeout=10), 404, "no portal when off")
        summary = gateway.report(targets, gateway.measure(targets, plan))
    print("\nportal on / off (this run):")
    print(f"{'cell':14} {'throughput':>10} {'p50':>8} {'cpu per request':>16}")
    for cell, rows in summary.items():
        ratio = rows.get("letsinfer/letsinfer-off") if isinstance(rows, dict) else None
        if ratio:
            cpu = ratio.get("cpu_per_request_ratio")
            print(
                f"{cell:14} {ratio['throughput_ratio']:9.3f}x {ratio['p50_ratio']:7.3f}x "
                f"{'-' if cpu is None else f'{cpu:.3f}x':>16}"
            )


def instruction_figures(requests: int) -> None:
    """The same two gateways under callgrind (benchmarks/instructions.py):
    instructions per request, which hold on a busy machine. Portal off is
    the ``before`` row, portal on the ``letsinfer`` row."""
    os.environ["PYTHONHASHSEED"] = "0"  # (as instructions.py: every row hashes alike)
    gateway.install_uvloop()
    print(f"\ngateway instructions (callgrind), portal off (before) and on (letsinfer): "
          f"{requests} requests a cell", flush=True)  # fmt: skip
    results: dict[str, dict[str, instructions.Row]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="letsinfer-bench-portal-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        work = Path(tmp)
        mock = gateway.start_mock(work, gateway.ZERO)
        stack.callback(mock.stop)
        for name, module in (
            ("before", "benchmarks.letsinfer_gateway"),
            ("letsinfer", "benchmarks.portal_gateway"),
        ):
            with contextlib.ExitStack() as own:  # one gateway under valgrind at a time
                target = gateway.start_gateway(
                    name,
                    work,
                    mock.url,
                    own,
                    *gateway.as_a_main(work, name),
                    module=module,
                    wrap=instructions.callgrind(work, name),
                    start_timeout=instructions.START_TIMEOUT_S,
                )
                if name == "letsinfer":  # its pages loaded, as a main's are
                    expect(httpx.get(target.url + "/ui/signin", timeout=60), 200, "portal")
                assert target.server is not None and target.server.proc is not None
                counter = instructions.Counter(target.server.proc.pid, work, name)
                counter.instrument()
                counter.zero()
                time.sleep(instructions.IDLE_S)
                idle = counter.read()
                results[name] = instructions.measure(target, counter, requests, idle)
    ratios = instructions.report(results)
    print("\nportal on / off, instructions per request (this run):")
    for cell, by in ratios.items():
        print(f"  {cell:14} {by['letsinfer/before']:.3f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--signup-only", action="store_true", help="only sign-up to first answer")
    only.add_argument("--gateway-only", action="store_true", help="only portal off and on")
    only.add_argument(
        "--instructions",
        type=int,
        metavar="N",
        help="only portal off and on under callgrind, N requests a cell (counted, not timed)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="accounts signed up (default 5)")
    parser.add_argument("--short", action="store_true", help="small counts (a quick check)")
    args = parser.parse_args(argv)
    if args.instructions:
        instruction_figures(args.instructions)
        return 0
    if not args.gateway_only:
        signup_figures(args.rounds)
    if not args.signup_only:
        gateway_figures(args.short)
    return 0


if __name__ == "__main__":
    sys.exit(main())
