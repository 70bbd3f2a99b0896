"""mkdocs hook: a ```bash tested fence (a shell block the tests run, docs/development.md) renders
as a plain ```bash block; Python-Markdown's fenced_code takes one word after the fence. A fence
inside another, longer fence (an example of the convention) is left as written."""

import re

_FENCE = re.compile(r"^[ ]*(?P<fence>`{3,})(?P<info>.*)$")


def on_page_markdown(markdown, page, config, files):
    lines, open_fence = markdown.split("\n"), None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if not m:
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        if open_fence is None:
            open_fence = fence
            if info == "bash tested":
                lines[i] = line.replace("bash tested", "bash", 1)
        elif fence == open_fence and not info:
            open_fence = None
    return "\n".join(lines)
