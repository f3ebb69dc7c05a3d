"""`from slime.utils.types import Sample` ports as `from slimeish.utils.types import Sample`."""

from slimeish.common.sample import Sample

__all__ = ["Sample"]
