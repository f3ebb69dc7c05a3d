"""KV pages: who owns which page of the pool, and the prefix cache that shares them across requests.

The pool holds `num_pages` pages of `page_size` token slots (the tensors live in the model runner;
this module only does the bookkeeping). A page is free, held by running sequences, or held by the
prefix cache, and may be both held and cached: every holder counts one reference.

The prefix cache is a trie of full pages keyed by their token ids (a page-granular radix tree): a
prompt whose first pages match a path reuses those pages' KV. A cached page nobody else references
is evictable; eviction takes least-recently-used leaves first, so a path is always cut from its end
and what stays cached is still reachable from the root.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class _Node:
    page: int
    key: tuple[int, ...]
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    last_used: int = 0


class PagePool:
    """Reference-counted pages plus the prefix cache over them."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() hands out low pages first
        self._refs = [0] * num_pages
        self._node_of: dict[int, _Node] = {}  # page -> its node, for cached pages
        self._root = _Node(-1, (), None)
        self._clock = itertools.count(1)
        self.evictable = 0  # cached pages with no reference but the cache's own

    # ---- capacity ----------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Pages a new allocation can get: free ones plus evictable cached ones."""
        return len(self._free) + self.evictable

    @property
    def cached_pages(self) -> int:
        return len(self._node_of)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # ---- references --------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """`n` fresh pages, each with one reference; evicts cached pages when the free list runs out."""
        assert n <= self.available, f"asked for {n} pages, {self.available} available"
        if n > len(self._free):
            self._evict(n - len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def acquire(self, pages: list[int]) -> None:
        for page in pages:
            self._refs[page] += 1
            if self._refs[page] == 2 and page in self._node_of:
                self.evictable -= 1

    def release(self, pages: list[int]) -> None:
        for page in pages:
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)
            elif self._refs[page] == 1 and page in self._node_of:
                self.evictable += 1

    # ---- the prefix cache --------------------------------------------------------------------
    def match(self, tokens: list[int], limit: int) -> list[int]:
        """The cached pages holding the longest page-aligned prefix of `tokens` no longer than
        `limit` tokens, with a reference taken on each for the caller."""
        node, pages, now = self._root, [], next(self._clock)
        for key in self._keys(tokens[: limit - limit % self.page_size]):
            child = node.children.get(key)
            if child is None:
                break
            child.last_used = now
            node = child
            pages.append(child.page)
        self.acquire(pages)
        return pages

    def insert(self, tokens: list[int], pages: list[int]) -> None:
        """Cache the full pages of a sequence whose KV for `tokens` lives in `pages`. A page whose
        tokens are already cached (by a concurrent twin) is not added: the cached one stays."""
        node, now = self._root, next(self._clock)
        for key, page in zip(self._keys(tokens), pages, strict=False):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(page, key, node)
                self._node_of[page] = child
                self._refs[page] += 1  # the cache's reference; the sequence still holds its own
            child.last_used = now
            node = child

    def flush(self) -> None:
        """Forget every cached prefix; pages still held by running sequences stay theirs."""
        nodes = list(self._node_of.values())
        self._root.children.clear()
        self._node_of.clear()
        self.evictable = 0
        self.release([n.page for n in nodes])

    def _keys(self, tokens: list[int]):
        size = self.page_size
        for a in range(0, len(tokens) - size + 1, size):
            yield tuple(tokens[a : a + size])

    def _evict(self, n: int) -> None:
        """Free `n` unreferenced cached pages, least recently used leaves first."""
        heap = [(nd.last_used, id(nd), nd) for nd in self._node_of.values() if not nd.children and self._idle(nd)]
        heapq.heapify(heap)
        for _ in range(n):
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            del self._node_of[node.page]
            self.evictable -= 1
            self._refs[node.page] = 0
            self._free.append(node.page)
            if parent is not self._root and not parent.children and self._idle(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))

    def _idle(self, node: _Node) -> bool:
        return self._refs[node.page] == 1
