"""ResourceClaims of driver vnpu.io: the operator's DRA front-end (docs/DRA.md)."""
