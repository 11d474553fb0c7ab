"""`gguf-trainer` (the console script) and `python app.py`: the GUI by default, every other
command through trainer_core's CLI. The launcher lives in ui so the core never imports it."""
from __future__ import annotations

import argparse
import sys

from trainer_core import cli
from trainer_core.base.errors import UsageError

__all__ = ["main", "serve_options"]


def serve_options(args: argparse.Namespace):
    """The parsed `serve` options as the GUI takes them."""
    from ui.app import ServeOptions
    return ServeOptions(host=args.host, port=args.port, open_browser=not args.no_browser, share=args.share,
                        auth=args.auth, projects_root=args.projects_root, allow_dirs=tuple(args.allow_dir),
                        demo_pack=args.demo_pack if args.demo else None)


def _port_free(host: str, port: int) -> bool:
    import socket
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
        return True
    except OSError:
        return False


def _port_taken(host: str, port: int) -> UsageError:
    """One sentence naming --port and a port that is free now."""
    free = next((p for p in range(port + 1, port + 50) if _port_free(host, p)), None)
    hint = f" (--port {free} is free now)" if free else ""
    return UsageError(f"Port {port} on {host} is already in use (another gguf-trainer, or another program); start "
                      f"the app with --port N{hint}, or stop what holds it.")


def _serve(args: argparse.Namespace) -> int:
    if not _port_free(args.host, args.port):        # before the auto-resume, the login setup and gradio's import
        raise _port_taken(args.host, args.port)
    if args.auto_resume:
        cli.auto_resume()
    from ui.app import main as serve_main      # gradio loads only when the GUI starts
    try:
        return serve_main(serve_options(args))
    except OSError as e:
        if "Cannot find empty port" in str(e):  # taken between the check and gradio's bind
            raise _port_taken(args.host, args.port) from None
        raise


def main(argv: list[str] | None = None) -> int:
    args = cli.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve" and not args.no_gui:
        return cli.run_command(args, _serve)
    return cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
