"""The package's version, and the format of the lock records it writes: apart, so that every
module may name them without an import cycle."""

__version__ = "0.2.0.dev0"

#: The format of the lock records this version writes. A process that finds a newer one under a
#: lock prefix takes no lock there (:class:`~dramatiq_unique.errors.NewerLockFormat`).
RECORD_FORMAT = 1
