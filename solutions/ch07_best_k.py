"""Solution of `ch07.best_k`."""


def best_k(alpha: float, draft_cost: float, verify_cost: list[float]) -> int:
    def tokens_per_pass(k: int) -> float:  # 1 + alpha + ... + alpha^k: the kept guesses and the target's token
        return sum(alpha**i for i in range(k + 1))

    speed = [tokens_per_pass(k) / (verify_cost[k] + k * draft_cost) for k in range(len(verify_cost))]
    best = 0
    for k in range(1, len(speed)):
        if speed[k] > speed[best]:  # strictly: a tie keeps the smaller k, and k = 0 unless something beats it
            best = k
    return best
