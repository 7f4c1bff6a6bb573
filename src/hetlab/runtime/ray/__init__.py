"""Collectors on a Ray cluster (`hetlab train --ray`): the connection (`cluster`), the actor side
and the learner side of each shared region (`ports`), and the pool itself (`pool`). Ray is the
optional extra `ray`; nothing outside `hetlab train --ray` and `hetlab info --ray` imports it.
"""

RELAY_BATCH = 16  # replay commits a collector may queue for its relay, and the most one relay call carries
RELAY_DEPTH = 2 * RELAY_BATCH  # commits a relay may hold beyond the replay's own queue: one batch queued, one being committed
