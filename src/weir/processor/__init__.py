"""The offline state processor: state in checkpoints and savepoints read as
DataFrames (Flink's State Processor API). Public names are exported by ``weir``."""
