"""Fresh ids for the rows every job writes: its job id and its messages' ids.

Time-ordered (UUID version 7, RFC 9562: 48 bits of Unix milliseconds, then random bits),
not random (version 4). Each id is the key of a B-tree entry that every job writes and
keeps: ``jobs_pkey`` (an entry per row version), ``outbox_job_idx``, and ``inbox_pkey``
(consumer, message id), kept for the dedup window. PostgreSQL fills a leaf page to its
fill factor (90 %) only when the page that splits is the index's rightmost, and halves
any other: random keys land all over the index and leave its pages about two thirds
full, where ids that grow with time go to its right end (docs/design.md, "An index of a
hot table earns the entries every job writes it"). The ids stay unguessable: 74 random
bits each. What they give away, the moment they were made, is the job's ``created_at``,
which whoever holds the id can read anyway.
"""

from __future__ import annotations

import uuid

from uuid_utils.compat import uuid7


def new_id() -> uuid.UUID:
    """A fresh time-ordered id (a standard library :class:`uuid.UUID`)."""
    return uuid7()
