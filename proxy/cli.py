"""Command line: ``oms-mpijob-proxy serve | check-config | render | routes | demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence

from proxy import frontdoors
from proxy.config import Config, ConfigError
from proxy.configload import Overrides, load_config
from proxy.routes import HEALTH_ROUTES, ROUTES

_LOGGER = logging.getLogger("proxy")


def _add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file (default: $OMS_MPIJOB_PROXY_CONFIG, else built-in defaults)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (documented in the README's CLI reference)."""
    parser = argparse.ArgumentParser(
        prog="oms-mpijob-proxy",
        description="Reverse proxy in front of OpenM++ oms that runs MPI model runs as MPIJobs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    _add_config_flag(serve)
    serve.add_argument("--host", help="listen address (server.host)")
    serve.add_argument("--port", type=int, help="listen port (server.port)")
    serve.add_argument("--oms-url", help="oms base URL (oms.url)")
    serve.add_argument("--namespace", help="namespace for MPIJobs (kubernetes.namespace)")
    serve.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (kubernetes.kubeconfig)")
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR (logging.level)")

    check = sub.add_parser("check-config", help="validate the config and template, then exit")
    _add_config_flag(check)

    render = sub.add_parser("render", help="print the MPIJob (and ConfigMap) YAML for a request")
    _add_config_flag(render)
    render.add_argument("request", metavar="REQUEST.json", help="a POST /api/run body")

    routes = sub.add_parser("routes", help="print the routes the proxy answers itself")
    routes.add_argument(
        "--format",
        choices=("text", "json", "istio", "ingress-nginx", "gateway-api"),
        default="text",
        help="text, json, or a front door's routes-only manifest (k8s/overlays/routes-only*)",
    )

    demo = sub.add_parser("demo", help="run the whole flow on in-process stand-ins")
    demo.add_argument("--serve", action="store_true", help="keep everything running")
    demo.add_argument("--port", type=int, default=8080, help="proxy port for --serve")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from proxy.accesslog import setup_logging
    from proxy.app import create_app, serve_until_signalled

    config = load_config(
        args.config,
        Overrides(
            host=args.host,
            port=args.port,
            oms_url=args.oms_url,
            namespace=args.namespace,
            kubeconfig=args.kubeconfig,
            log_level=args.log_level,
        ),
    )
    setup_logging(config.logging.level)
    app = create_app(config)
    _LOGGER.info(
        "listening on %s:%d, oms at %s, config %s, event loop %s",
        config.server.host,
        config.server.port,
        config.oms.url,
        config.source,
        config.server.event_loop,
    )
    if config.server.event_loop == "uvloop":
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(serve_until_signalled(app, config))
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not task.done():
            task.cancel()  # its finally shuts the server down gracefully
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return 0


def _check_config(args: argparse.Namespace) -> Config:
    """Load the config and the MPIJob template it names; either raises ConfigError."""
    from proxy.submit.template import load_template

    config = load_config(args.config)
    if config.runs.intercept != "none":
        load_template(config.template_path())
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "check-config":
            config = _check_config(args)
            print(f"{config.source}: OK")
            return 0
        if args.command == "routes":
            return print_routes(args.format)
        if args.command == "render":
            from proxy.render_cli import render_command

            return render_command(args.config, args.request)
        if args.command == "demo":
            try:  # the stand-ins ship with the distribution, not with the container image
                from standins.demo import run_demo
            except ModuleNotFoundError:
                print("the demo needs the stand-ins (pip install the repository)", file=sys.stderr)
                return 2
            return run_demo(serve=args.serve, port=args.port)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return 2
    return 2  # pragma: no cover


def print_routes(fmt: str) -> int:
    """Print the intercepted routes (text, JSON, or a front door's routes-only manifest)."""
    routes = ROUTES + HEALTH_ROUTES
    if fmt in frontdoors.FORMATS:
        print(frontdoors.render(fmt), end="")
    elif fmt == "json":
        print(json.dumps([dataclasses.asdict(r) for r in routes], indent=2))
    else:
        for r in routes:
            print(f"{r.method:5} {r.regex:55} {r.doc}")
    return 0
