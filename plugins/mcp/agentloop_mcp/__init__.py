"""agentloop-mcp: the tools of MCP servers as agentloop tools.

Declare servers in code (`MCPServer.stdio(...)`, `MCPServer.http(...)`) or read them from
an `mcpServers` config file (`load_config`), open an `MCPToolSource` on them, and give
its tools to an agent: they run in agentloop's registry like any other tool. The names
are imported on first use: the `agentloop` command loads the plugin on every start.
"""

import typing

from agentloop.lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from .background import BackgroundToolSource as BackgroundToolSource
    from .background import MCPToolInfo as MCPToolInfo
    from .background import list_config_tools as list_config_tools
    from .capabilities import ElicitationHandler as ElicitationHandler
    from .capabilities import terminal_elicitation as terminal_elicitation
    from .config import MCPConfigError as MCPConfigError
    from .config import MCPOAuth as MCPOAuth
    from .config import MCPServer as MCPServer
    from .config import load_config as load_config
    from .config import parse_config as parse_config
    from .connection import MCPConnectError as MCPConnectError
    from .connection import MCPRequestError as MCPRequestError
    from .content import to_content as to_content
    from .sampling import MCPSampling as MCPSampling
    from .source import MCPProblem as MCPProblem
    from .source import MCPToolSource as MCPToolSource
    from .tools import MCPTool as MCPTool
    from .transport import MCPAuthError as MCPAuthError

__version__ = "0.1.0"

# Where each exported name is defined: the module (below this package) it is imported from.
_MODULES = {
    "BackgroundToolSource": "background",
    "ElicitationHandler": "capabilities",
    "MCPAuthError": "transport",
    "MCPConfigError": "config",
    "MCPConnectError": "connection",
    "MCPOAuth": "config",
    "MCPProblem": "source",
    "MCPRequestError": "connection",
    "MCPSampling": "sampling",
    "MCPServer": "config",
    "MCPTool": "tools",
    "MCPToolInfo": "background",
    "MCPToolSource": "source",
    "list_config_tools": "background",
    "load_config": "config",
    "parse_config": "config",
    "terminal_elicitation": "capabilities",
    "to_content": "content",
}

__all__ = tuple(sorted(_MODULES))

__getattr__, __dir__ = _lazy_exports(globals(), _MODULES)
