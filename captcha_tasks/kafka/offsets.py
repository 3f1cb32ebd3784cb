"""Which offsets the bridge may commit, when tasks finish out of order.

A consumed message is *pending* until every answer it needs (its result, its dead letter)
has been acknowledged by the brokers.  The commit point of a partition is the offset of
its oldest pending message, or the offset after the last one consumed when none is
pending: everything below it is answered, so a crash redelivers only unanswered work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class Pending:
    """One consumed message, until it is finished."""

    __slots__ = ("finished", "offset", "owner", "partition")

    def __init__(self, partition: int, offset: int, owner: object) -> None:
        self.partition = partition
        self.offset = offset
        # The partition's state when it was consumed: a message consumed before a revoke
        # must not finish anything in a later assignment of the same partition.
        self.owner = owner
        self.finished = False

    def __repr__(self) -> str:
        state = "finished" if self.finished else "pending"
        return f"<Pending {self.partition}@{self.offset} {state}>"


class _Partition:
    def __init__(self) -> None:
        self.queue: deque[Pending] = deque()  # consumed in offset order
        self.next_offset: int | None = None
        self.committed: int | None = None
        self.unfinished = 0

    def commit_point(self) -> int | None:
        while self.queue and self.queue[0].finished:
            self.queue.popleft()
        return self.queue[0].offset if self.queue else self.next_offset


class OffsetTracker:
    """Pending messages per partition of one topic, and their commit points."""

    def __init__(self) -> None:
        self._partitions: dict[int, _Partition] = {}

    def track(self, partition: int, offset: int) -> Pending:
        """Register a consumed message (offsets of a partition arrive in increasing order)."""
        part = self._partitions.setdefault(partition, _Partition())
        if part.next_offset is not None and offset < part.next_offset:
            raise ValueError(
                f"offset {offset} of partition {partition} went backwards "
                f"(expected >= {part.next_offset}); forget() the partition after a seek"
            )
        pending = Pending(partition, offset, part)
        part.queue.append(pending)
        part.next_offset = offset + 1
        part.unfinished += 1
        return pending

    def finish(self, pending: Pending) -> bool:
        """Mark a message answered; False if its partition was forgotten since (revoked)."""
        part = self._partitions.get(pending.partition)
        if pending.finished or part is None or pending.owner is not part:
            return False
        pending.finished = True
        part.unfinished -= 1
        return True

    def pending_count(self) -> int:
        """Messages consumed and not yet answered, over every partition."""
        return sum(part.unfinished for part in self._partitions.values())

    def commit_points(
        self, partitions: Iterable[int] | None = None, *, changed_only: bool = True
    ) -> dict[int, int]:
        """Offsets to commit per partition (only those that moved, unless told otherwise)."""
        chosen = self._partitions if partitions is None else set(partitions)
        points: dict[int, int] = {}
        for number in chosen:
            part = self._partitions.get(number)
            if part is None:
                continue
            point = part.commit_point()
            if point is not None and (not changed_only or point != part.committed):
                points[number] = point
        return points

    def mark_committed(self, points: dict[int, int]) -> None:
        """Record offsets the consumer has committed."""
        for number, offset in points.items():
            part = self._partitions.get(number)
            if part is not None:
                part.committed = offset

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop revoked partitions: their pending messages will be redelivered elsewhere."""
        for number in partitions:
            self._partitions.pop(number, None)

    def partitions(self) -> set[int]:
        """Partitions with consumed messages tracked."""
        return set(self._partitions)
