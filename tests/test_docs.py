"""README's first screen links the guides in docs/: every link resolves, every guide is linked."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_guide_is_linked_from_the_readme_and_every_link_resolves():
    readme = (REPO / "README.md").read_text()
    links = set(re.findall(r"\]\((docs/[^)#]+)\)", readme))
    assert links and all((REPO / link).is_file() for link in links), links
    guides = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert guides - links == set()
    for guide in guides:  # links between the guides (and to figures) resolve too
        for target in re.findall(r"\]\(([^)#:]+)\)", (REPO / guide).read_text()):
            assert (REPO / "docs" / target).exists(), (guide, target)
