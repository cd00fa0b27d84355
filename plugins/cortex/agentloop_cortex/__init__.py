"""agentloop-cortex: a persona's memory, soul and relationship notes as safe, versioned files.

The model gets four tools (`read_file`, `write_file`, `append_file`, `replace_in_file`)
over three files per persona; each run says where they live with
`deps=CortexConfig(root=..., persona=...)`. The plugin also adds its part to the
`agentloop` command (`agentloop_cortex.cli`): `--persona`, `--cortex-root`, the offline
demo (`agentloop_cortex.demo`) and a report of the files. `MEMORY_TOOL` is Claude's
memory tool over the same folder (`agentloop run --memory-tool`).
"""

from .config import CortexConfig as CortexConfig
from .memory_store import MemoryStore as MemoryStore
from .memory_tool import MEMORY_TOOL as MEMORY_TOOL
from .store import FILENAMES as FILENAMES
from .store import Change as Change
from .store import CortexFile as CortexFile
from .store import CortexStore as CortexStore
from .tools import TOOLS as TOOLS
from .tools import append_file as append_file
from .tools import read_file as read_file
from .tools import replace_in_file as replace_in_file
from .tools import write_file as write_file

__version__ = "0.1.0"

__all__ = (
    "FILENAMES",
    "MEMORY_TOOL",
    "TOOLS",
    "Change",
    "CortexConfig",
    "CortexFile",
    "CortexStore",
    "MemoryStore",
    "append_file",
    "read_file",
    "replace_in_file",
    "write_file",
)
