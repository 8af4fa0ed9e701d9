"""The ledger's kinds of leftovers: asyncio tasks, pools, DataLoader workers, child processes."""
