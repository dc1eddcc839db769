"""The hot-key sketch: top identities by a weight in bounded memory, however many identities an
attacker uses."""

import heapq

__all__ = ["SpaceSaving"]


class SpaceSaving:
    """Top identities by a weight in bounded memory (Metwally et al., weighted Space-Saving).

    At most ``capacity`` identities are tracked. An untracked identity with weight replaces the
    lightest one and inherits its weight (an over-estimate, kept as ``error``), which guarantees
    that every identity whose true weight exceeds total / capacity is tracked. Each entry also
    counts exact ``tokens``, ``denials`` and ``requests`` seen since it was tracked.
    Cost per update: O(1) for a tracked identity, O(log capacity) amortised otherwise.
    """

    def __init__(self, capacity):
        self.capacity = max(1, int(capacity))
        self.entries = {}  # member -> [weight, error, tokens, denials, requests]
        self._heap = []    # (weight when pushed, member); one per entry, possibly stale (lower)

    def __len__(self):
        return len(self.entries)

    def add(self, member, weight, tokens, denials):
        entry = self.entries.get(member)
        if entry is not None:
            entry[0] += weight
            entry[2] += tokens
            entry[3] += denials
            entry[4] += 1
            return
        if weight > 0:  # only weight earns a place in the sketch
            self._track(member, weight, 0, tokens, denials, 1)

    def top(self, count):
        """Return the ``count`` heaviest ``(member, entry)`` pairs, heaviest first."""
        return heapq.nlargest(count, self.entries.items(), key=lambda item: item[1][0])

    def merge(self, other):
        """Add every entry of ``other`` (same rules as ``add``, all five figures summed)."""
        for member, (weight, error, tokens, denials, requests) in other.entries.items():
            entry = self.entries.get(member)
            if entry is not None:
                for index, value in enumerate((weight, error, tokens, denials, requests)):
                    entry[index] += value
                continue
            self._track(member, weight, error, tokens, denials, requests)

    def truncate(self, count):
        """Keep only the ``count`` heaviest entries (what a flush would write of them)."""
        if len(self.entries) <= count:
            return
        self.entries = {member: entry for member, entry in self.top(count)}
        self._heap = [(entry[0], member) for member, entry in self.entries.items()]
        heapq.heapify(self._heap)

    def _track(self, member, weight, error, tokens, denials, requests):
        """Start tracking ``member``; when full, it replaces the lightest entry and inherits
        that entry's weight (added to its weight and its error)."""
        if len(self.entries) < self.capacity:
            self.entries[member] = [weight, error, tokens, denials, requests]
            heapq.heappush(self._heap, (weight, member))
            return
        pushed, victim = self._lightest()
        del self.entries[victim]
        self.entries[member] = [pushed + weight, pushed + error, tokens, denials, requests]
        heapq.heapreplace(self._heap, (pushed + weight, member))

    def _lightest(self):
        """Return ``(weight, member)`` of the lightest entry. Weights only grow, so a heap entry
        may be stale (too low): refresh until the top is exact; it is then the lightest."""
        heap = self._heap
        while True:
            pushed, victim = heap[0]
            current = self.entries[victim][0]
            if current == pushed:
                return pushed, victim
            heapq.heapreplace(heap, (current, victim))
