"""MkDocs hooks of the docs site (mkdocs.yml `hooks:`): the reference pages are generated from the
code, and a link out of docs/ must name a file of the repository.

- `<!-- generated: cli -->`: every command and subcommand of the Typer app (`codegen.cli.app`):
  usage, help, options with their help and defaults.
- `<!-- generated: spec -->`: every field of the target spec, from the Pydantic JSON Schema
  (`codegen.formats.spec.spec_json_schema`): path, type, default, description.
- `<!-- generated: index -->`: every field of the bundle index (`index.json`), from its Pydantic
  JSON Schema (`codegen.ship.index.index_json_schema`), and the schema itself.
- `<!-- generated: exit-codes -->`: the exit codes of `codegen.core.errors` and the error classes that
  carry them.
- A relative link that leaves docs/ (`../rules/mi50.yaml`) must name a file or folder of the
  repository, else the build warns (and `mkdocs build --strict` fails); it becomes a link to the
  repository when `repo_url` is set, else the path as code.

`python scripts/mkdocs_hooks.py cli|spec|index|exit-codes` prints a generated section (for review)."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

log = logging.getLogger("mkdocs.plugins.mi100_codegen")
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------------------------- CLI --

def _commands():
    """(path, click command) for every command and subcommand, in the root help's order."""
    import typer

    from codegen.cli import STAGE_COMMANDS, app, stage_command

    root = typer.main.get_command(app)
    out = []
    for name in root.list_commands(None):
        cmd = stage_command(name) if name in STAGE_COMMANDS else root.commands[name]
        out.append(([name], cmd))
        for sub in getattr(cmd, "commands", {}):
            out.append(([name, sub], cmd.commands[sub]))
    return out


def _default(param) -> str:
    if getattr(param, "required", False):
        return "required"
    d = param.default
    if d is None or d == () or d == [] or callable(d) or isinstance(d, bool) and d is False:
        return ""
    return f"`{d}`"


def cli_reference() -> str:
    import click

    L = []
    for path, cmd in _commands():
        name = " ".join(path)
        L.append(f"## `mi100-codegen {name}`")
        L.append("")
        ctx = click.Context(cmd, info_name=f"mi100-codegen {name}")
        pieces = cmd.collect_usage_pieces(ctx)
        L.append(f"```\nmi100-codegen {name} {' '.join(pieces)}\n```")
        L.append("")
        for para in (cmd.help or "").strip().split("\n\n"):
            L.append(" ".join(para.split()))
            L.append("")
        rows = []
        for p in cmd.params:
            if p.name == "help":
                continue
            if p.param_type_name == "argument":
                names = f"`{p.name.upper()}`"
            else:
                names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            rows.append(f"| {names} | {_cell(getattr(p, 'help', '') or '')} | {_default(p)} |")
        if rows:
            L += ["| argument / option | what | default |", "|---|---|---|", *rows, ""]
        if getattr(cmd, "commands", None):
            L.append("Subcommands: " + ", ".join(f"[`{s}`](#mi100-codegen-{'-'.join(path)}-{s})"
                                                 for s in cmd.commands) + ".")
            L.append("")
    return "\n".join(L)


# ------------------------------------------------------------------------------------ spec --

def _type(prop: dict) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " or ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    t = prop.get("type", "any")
    if t == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if t == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"map to {_type(prop['additionalProperties'])}"
    bounds = [f"≥ {prop['minimum']}" if "minimum" in prop else "", f"≤ {prop['maximum']}" if "maximum" in prop else ""]
    bounds = [b for b in bounds if b]
    return t + (f" ({', '.join(bounds)})" if bounds else "")


def _fields(model: dict, required: set[str]) -> list[str]:
    rows = []
    for name, prop in sorted(model.get("properties", {}).items()):
        default = "required" if name in required else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
        rows.append(f"| `{name}` | {_cell(_type(prop))} | {_cell(default)} | {_cell(prop.get('description', ''))} |")
    return rows


def _schema_reference(schema: dict, top: str, level: str = "##") -> str:
    head = ["| field | type | default | description |", "|---|---|---|---|"]
    L = [f"{level} {top}", "", _cell(schema.get("description", "")), "", *head,
         *_fields(schema, set(schema.get("required", []))), ""]
    for name, model in sorted(schema.get("$defs", {}).items()):
        L += [f"{level} {name}", ""]
        if model.get("description"):
            L += [_cell(model["description"]), ""]
        if "properties" in model:
            L += [*head, *_fields(model, set(model.get("required", []))), ""]
        else:
            L += [f"Type: {_cell(_type(model))}", ""]
    return "\n".join(L)


def spec_reference() -> str:
    from codegen.formats.spec import spec_json_schema

    return _schema_reference(json.loads(spec_json_schema()), "The spec (top level)")


def index_reference() -> str:
    """The bundle index's fields, then its JSON Schema (`codegen.ship.index.index_json_schema`)."""
    from codegen.ship.index import index_json_schema

    schema = index_json_schema()
    return (_schema_reference(schema, "index.json (top level)", "###")
            + "\n??? note \"The JSON Schema of index.json\"\n    ```json\n"
            + "\n".join(f"    {line}" for line in json.dumps(schema, indent=2, sort_keys=True).splitlines())
            + "\n    ```\n")


# ------------------------------------------------------------------------------ exit codes --

def exit_codes_reference() -> str:
    import codegen.core.errors as errors

    meaning = {"EXIT_OK": "success", "EXIT_DRIFT": "drift: `render --check` found the overlay stale",
               "EXIT_USER": "user error: a bad spec, tree, option or path (checked before any work starts)",
               "EXIT_UPSTREAM": "upstream, build, GPU failure or a missing environment (no torch, Triton, GPU)",
               "EXIT_INTERRUPTED": "interrupted (Ctrl-C at any moment: one line, no traceback)"}
    classes: dict[int, list[str]] = {}
    for name in sorted(dir(errors)):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, errors.CodegenError):
            classes.setdefault(obj.exit_code, []).append(f"`{name}`")
    L = ["| code | constant | meaning | raised as |", "|---|---|---|---|"]
    for const in ("EXIT_OK", "EXIT_DRIFT", "EXIT_USER", "EXIT_UPSTREAM", "EXIT_INTERRUPTED"):
        code = getattr(errors, const)
        L.append(f"| {code} | `{const}` | {meaning[const]} | {', '.join(classes.get(code, [])) or '-'} |")
    return "\n".join(L) + "\n"


GENERATORS = {"cli": cli_reference, "spec": spec_reference, "exit-codes": exit_codes_reference,
              "index": index_reference}


# ------------------------------------------------------------------------------- the hooks --

def _repo_link(target: str, page_src: str, docs_dir: Path, repo_url: str | None) -> str | None:
    """The replacement of a relative link that leaves docs/, None for a link that stays inside."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
        return None
    path, _, anchor = target.partition("#")
    resolved = (docs_dir / Path(page_src).parent / path).resolve()
    try:
        resolved.relative_to(docs_dir.resolve())
        return None
    except ValueError:
        pass
    try:
        rel = resolved.relative_to(REPO).as_posix()
    except ValueError:
        rel = None
    if rel is None or not resolved.exists():
        log.warning("%s: link to %s, which is not a file of the repository", page_src, target)
        return None
    if repo_url:
        kind = "tree" if resolved.is_dir() else "blob"
        return f"{repo_url.rstrip('/')}/{kind}/main/{rel}" + (f"#{anchor}" if anchor else "")
    return ""


def on_page_markdown(markdown: str, page, config, files) -> str:
    for name, gen in GENERATORS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, gen())
    docs_dir = Path(config["docs_dir"])
    repo_url = config.get("repo_url")

    def link(m: re.Match) -> str:
        new = _repo_link(m.group(2), page.file.src_uri, docs_dir, repo_url)
        if new is None:
            return m.group(0)
        if new:
            return f"[{m.group(1)}]({new})"
        text = m.group(1)
        return text if text.startswith("`") else f"`{text}`"

    return _LINK.sub(link, markdown)


if __name__ == "__main__":
    sys.stdout.write(GENERATORS[sys.argv[1]]())
