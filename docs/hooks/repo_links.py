"""MkDocs hook: the site's links to repository files outside ``docs/``, which work where GitHub
renders the Markdown (``../bench/README.md``, ``../core/src/graft/hookspecs/``).

- A Markdown file of the repository that a page links to (a plugin's README, the benchmarks'
  table) becomes a page of the site under ``repo/`` (its path in the repository), and the link
  points there.
- A link to any other repository file or folder points into the repository (``repo_url`` in
  mkdocs.yml) or, without one, becomes the file's path as code.
- A link to a path that does not exist is a warning, so ``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.repo_links")
LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```$", re.M | re.S)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")
SITE_FOLDER = "repo"


def outside_text(markdown: str) -> list[str]:
    """The page's text outside fenced code blocks."""
    return FENCE.split(markdown)


def linked_repo_pages(docs: Path, repo: Path) -> set[Path]:
    """The repository's Markdown files outside ``docs`` that a documentation page links to."""
    found = set()
    for page in docs.rglob("*.md"):
        for text in outside_text(page.read_text()):
            for _, target in LINK.findall(text):
                path = target.partition("#")[0]
                if not path or SCHEME.match(path) or path.startswith("/"):
                    continue
                source = (page.parent / path).resolve()
                if source.suffix == ".md" and source.is_file() and repo in source.parents \
                        and docs not in source.parents:
                    found.add(source)
    return found


def on_files(files: Any, config: Any) -> Any:
    """Add the linked repository Markdown files as pages under ``repo/``."""
    docs = Path(config["docs_dir"]).resolve()
    for source in sorted(linked_repo_pages(docs, docs.parent)):
        uri = f"{SITE_FOLDER}/{source.relative_to(docs.parent).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Point the page's links to repository files at their page in the site or at the repo."""
    docs = Path(config["docs_dir"]).resolve()
    repo = docs.parent
    here = Path(page.file.abs_src_path).parent
    page_dir = os.path.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        text, target = match.groups()
        path, _, anchor = target.partition("#")
        if not path or SCHEME.match(path) or path.startswith("/"):
            return match[0]
        source = (here / path).resolve()
        if not source.exists() or repo not in [source, *source.parents]:
            log.warning("%s links to %r, which is not in the repository", page.file.src_uri,
                        target)
            return match[0]
        suffix = f"#{anchor}" if anchor else ""
        in_docs = docs in source.parents and files.get_file_from_path(
            source.relative_to(docs).as_posix())
        in_site = in_docs or files.get_file_from_path(
            f"{SITE_FOLDER}/{source.relative_to(repo).as_posix()}")
        if in_site:
            return f"[{text}]({os.path.relpath(in_site.src_uri, page_dir or '.')}{suffix})"
        relative = source.relative_to(repo).as_posix() + ("/" if source.is_dir() else "")
        if config.get("repo_url"):
            kind = "tree" if source.is_dir() else "blob"
            return f"[{text}]({config['repo_url'].rstrip('/')}/{kind}/HEAD/{relative}{suffix})"
        return text if text.strip("`") == relative.rstrip("/") else f"{text} (`{relative}`)"

    parts = FENCE.split(markdown)
    fences = FENCE.findall(markdown)
    out = [LINK.sub(rewrite, parts[0])]
    for fence, text in zip(fences, parts[1:], strict=True):
        out += [fence, LINK.sub(rewrite, text)]
    return "".join(out)
