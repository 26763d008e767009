"""CONV-13: a split by row of data with several rows per user (the same users land in train and
validation) vs a split by the grouping key (the Fix). The Verify is the entry's overlap test on the key."""

from __future__ import annotations


def run(case) -> str:
    import random

    rows = [(user, i) for user in range(20) for i in range(5)]  # five rows per user
    rng = random.Random(0)
    if case.fixed:
        users = list(range(20))
        rng.shuffle(users)
        val_users = set(users[:4])
        train = [r for r in rows if r[0] not in val_users]
        val = [r for r in rows if r[0] in val_users]
    else:
        rng.shuffle(rows)
        train, val = rows[:80], rows[80:]
    namespace = {"train_ids": [r[0] for r in train], "val_ids": [r[0] for r in val]}
    return case.exec(f"print('no leak:', {case.code('Verify', 'set(train_ids) & set(val_ids)')})", namespace)


def passed(outputs: list[str]) -> bool:
    return all(out.strip() == "no leak: True" for out in outputs)
