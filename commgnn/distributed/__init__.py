"""Runtime leaf: process groups, launch, and the communication event bus."""

from commgnn.distributed.config import RuntimeConfig
from commgnn.distributed.context import DistContext, LaunchInfo, init_distributed, launch_info_from_env, shutdown
from commgnn.distributed.events import CommEvent, Hooks, TimeEvent

__all__ = ["DistContext", "LaunchInfo", "RuntimeConfig", "init_distributed", "launch_info_from_env",
           "shutdown", "CommEvent", "Hooks", "TimeEvent"]
