"""A durable entity (docs/guides/entities.md): an account per number whose deposits and
withdrawals run one at a time, and whose balance anyone may read at once."""

from __future__ import annotations

import runstream

app = runstream.App("bank")


@app.step()
def record(account: str, amount: int) -> str:
    return f"tx-{account}-{amount}"  # stands in for a call to the bank's ledger service


@app.entity("account")
class Account:
    @staticmethod
    async def deposit(ctx: runstream.EntityContext, amount: int) -> int:
        await ctx.step(record, ctx.key, amount)
        balance = int(ctx.state.get("balance", 0)) + amount
        ctx.state.set("balance", balance)
        return balance

    @staticmethod
    async def withdraw(ctx: runstream.EntityContext, amount: int) -> int:
        balance = int(ctx.state.get("balance", 0))
        if amount > balance:
            raise ValueError(f"insufficient funds: {balance}")
        await ctx.step(record, ctx.key, -amount)
        ctx.state.set("balance", balance - amount)
        return balance - amount

    @staticmethod
    @runstream.shared
    def balance(ctx: runstream.SharedContext, _: None) -> int:
        return int(ctx.state.get("balance", 0))


@app.workflow()
async def payday(ctx: runstream.Context, accounts: list[str]) -> list[int]:
    """Pays 100 into each account, one call after the other (each journaled once)."""
    return [await ctx.entity("account", a).call("deposit", 100) for a in accounts]


@app.workflow()
async def statement(ctx: runstream.Context, accounts: list[str]) -> int:
    """The total of the accounts' balances: shared reads, each answered once and recorded
    (a replay returns the same figures)."""
    return sum([await ctx.entity("account", a).read("balance") for a in accounts])
