"""CLI command modules. Each defines ``app = typer.Typer(...)``: a group names itself
(``typer.Typer(name="lab")``), a module of top-level commands does not; ``wanprobe/cli.py`` adds
every one with ``app.add_typer(module.app)``."""
