"""An HTML page as a browser would read it: its text, links, plots and anything it would fetch."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """What a page is made of: its text, its links, anything it would fetch."""

    def __init__(self, text: str):
        super().__init__()
        self.text, self.links, self.fetches, self.svgs = [], [], [], 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.svgs += 1
        if tag == "a":
            self.links.append(attrs.get("href"))
        if tag in ("img", "script", "iframe", "link", "image", "use") and (attrs.get("src") or attrs.get("href")):
            self.fetches.append((tag, attrs.get("src") or attrs.get("href")))

    def handle_data(self, data):
        self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join(" ".join(self.text).split())
