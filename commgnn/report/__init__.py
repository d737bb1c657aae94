"""Run records (files) and console output."""

from commgnn.report.console import EpochProgress, human_bytes, print_summary, summary_table
from commgnn.report.records import (MetricsLog, commit_out_dir, git_commit, host_info, library_versions,
                                    json_field, prepare_out_dir, read_json, summarise, write_json, write_status)

__all__ = ["EpochProgress", "human_bytes", "print_summary", "summary_table", "MetricsLog",
           "commit_out_dir", "git_commit", "host_info", "json_field", "library_versions", "prepare_out_dir",
           "read_json", "summarise", "write_json", "write_status"]
