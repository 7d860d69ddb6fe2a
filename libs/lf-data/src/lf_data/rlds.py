"""Open X-Embodiment / RLDS datasets without TensorFlow: TFRecord with CRC checks, Example decoding.

See the package README for the feature layouts and action conventions.
"""

from ._errors import DataError
from ._rlds import EEF_ACTION_KEYS, GRIPPER_KEYS, INSTRUCTION_KEYS, RLDSDataset
from ._tf_example import parse_example, parse_sequence_example
from ._tfrecord import crc32c, iter_tfrecord, masked_crc32c, read_record_at, read_tfrecord

__all__ = [
    "DataError",
    "EEF_ACTION_KEYS",
    "GRIPPER_KEYS",
    "INSTRUCTION_KEYS",
    "RLDSDataset",
    "crc32c",
    "iter_tfrecord",
    "masked_crc32c",
    "parse_example",
    "parse_sequence_example",
    "read_record_at",
    "read_tfrecord",
]
