"""Runtime leaf: process groups, launch, and the communication event bus."""

from commgnn.dist.context import (DistContext, LaunchInfo, RuntimeConfig, init_distributed,
                                  launch_info_from_env, shutdown)
from commgnn.dist.events import CommEvent, Hooks, TimeEvent

__all__ = ["DistContext", "LaunchInfo", "RuntimeConfig", "init_distributed", "launch_info_from_env",
           "shutdown", "CommEvent", "Hooks", "TimeEvent"]
