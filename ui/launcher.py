"""`gguf-trainer` (the console script) and `python app.py`: the GUI by default, every other
command through trainer_core's CLI. The launcher lives in ui so the core never imports it."""
from __future__ import annotations

import argparse
import sys

from trainer_core import cli

__all__ = ["main", "serve_options"]


def serve_options(args: argparse.Namespace):
    """The parsed `serve` options as the GUI takes them."""
    from ui.app import ServeOptions
    return ServeOptions(host=args.host, port=args.port, open_browser=not args.no_browser, share=args.share,
                        auth=args.auth, projects_root=args.projects_root, allow_dirs=tuple(args.allow_dir),
                        demo_pack=args.demo_pack if args.demo else None)


def _serve(args: argparse.Namespace) -> int:
    if args.auto_resume:
        cli.auto_resume()
    from ui.app import main as serve_main      # gradio loads only when the GUI starts
    return serve_main(serve_options(args))


def main(argv: list[str] | None = None) -> int:
    args = cli.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve" and not args.no_gui:
        return cli.run_command(args, _serve)
    return cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())
