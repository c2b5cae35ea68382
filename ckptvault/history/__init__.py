"""The bucket's history: what its keys held at a past time, read from the store's object versions.

Point-in-time reads and recovery (docs/object-lock.md, "After an attack") rest on two decisions kept
here as pure functions, so a unit test reaches every case without a server: which moment a user means
(`as_of.parse_as_of`), which version of a key was current then and what changed since (`versions`),
and the plan that undoes those changes without deleting any data version (`recovery`).
"""
