"""CLI: `dpicl ui` — the Prefect server and the MLflow UI on 127.0.0.1 until Ctrl-C or SIGTERM.

Both servers run in their own process groups, so stopping `dpicl ui` (Ctrl-C, SIGTERM, or a
server that dies) stops every process they started: nothing is left holding the ports.
A port already in use is refused before anything starts, naming the port and the flag.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from dpcore.errors import ConfigError
from dpcore.home import dpicl_home, long_lived_server_environment, subdir
from flows.cli.common import command

STOP_GRACE_S = 15.0


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _check_port(host: str, port: int, flag: str) -> None:
    if not 0 < port < 65536:
        raise ConfigError(f"{flag} {port}: not a TCP port (1-65535)")
    if port_in_use(host, port):
        raise ConfigError(f"{flag} {port}: {host}:{port} is already in use (another server, or an earlier "
                          f"`dpicl ui`?); pick a free port with {flag}")


def _stop(procs: list[tuple[str, subprocess.Popen]]) -> None:
    """SIGINT each server's process group, then SIGTERM, then SIGKILL what is still there."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [(name, p) for name, p in procs if p.poll() is None or _group_alive(p.pid)]
        if not alive:
            return
        for _, p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(p.poll() is None or _group_alive(p.pid) for _, p in alive):
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ui(args) -> int:
    if args.no_prefect and args.no_mlflow:
        raise ConfigError("--no-prefect and --no-mlflow: nothing left to start")
    if not args.no_prefect:
        _check_port(args.host, args.prefect_port, "--prefect-port")
    if not args.no_mlflow:
        _check_port(args.host, args.mlflow_port, "--mlflow-port")
    home = dpicl_home()
    env = long_lived_server_environment(dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    bin_dir = os.path.dirname(sys.executable)
    commands: list[tuple[str, list[str], int]] = []
    if not args.no_prefect:
        prefect = shutil.which("prefect", path=bin_dir) or "prefect"
        commands.append(("prefect", [prefect, "server", "start", "--host", args.host, "--port",
                                     str(args.prefect_port)], args.prefect_port))
    if not args.no_mlflow:
        mlflow = shutil.which("mlflow", path=bin_dir) or "mlflow"
        db = subdir("mlflow") / "mlflow.db"
        commands.append(("mlflow", [mlflow, "server", "--host", args.host, "--port", str(args.mlflow_port),
                                    "--backend-store-uri", f"sqlite:///{db}", "--default-artifact-root",
                                    (subdir("mlflow") / "artifacts").as_uri(), "--workers", "1"], args.mlflow_port))
    log_dir = subdir("logs")
    procs: list[tuple[str, subprocess.Popen]] = []

    def on_term(signum, frame):  # SIGTERM stops like Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for name, command, _ in commands:
            log = open(log_dir / f"{name}-server.log", "ab")  # noqa: SIM115 (the child owns it)
            procs.append((name, subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True)))
            log.close()
        print(f"DPICL_HOME {home}")
        if not args.no_prefect:
            print(f"Prefect UI  http://{args.host}:{args.prefect_port}/   "
                  f"(export PREFECT_API_URL=http://{args.host}:{args.prefect_port}/api to send runs there)")
        if not args.no_mlflow:
            print(f"MLflow UI   http://{args.host}:{args.mlflow_port}/")
        print(f"server logs: {log_dir}/<server>-server.log. Ctrl-C stops both.", flush=True)
        while all(p.poll() is None for _, p in procs):
            time.sleep(0.5)
        for (name, p), (_, _, port) in zip(procs, commands, strict=True):
            if p.poll() is not None:
                print(f"dpicl ui: {name} server stopped (exit code {p.returncode}) on port {port}; "
                      f"see {log_dir / (name + '-server.log')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping the servers...", file=sys.stderr, flush=True)
        return 0
    finally:
        _stop(procs)
        signal.signal(signal.SIGTERM, previous)


def register(subparsers) -> None:
    ui = command(subparsers, "ui", _ui, help="start the Prefect server and the MLflow UI on 127.0.0.1",
                 description="Serve the Prefect UI and the MLflow UI over $DPICL_HOME's stores until "
                             "Ctrl-C or SIGTERM.")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ui.add_argument("--prefect-port", type=int, default=4200, help="Prefect server port (default 4200)")
    ui.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default 5000)")
    ui.add_argument("--no-prefect", action="store_true", help="only the MLflow UI")
    ui.add_argument("--no-mlflow", action="store_true", help="only the Prefect server")
