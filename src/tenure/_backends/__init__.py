"""The two backends the primitives run on: asyncio, and threads (the generated sync twin)."""
