"""agentloop-mcp: the tools of MCP servers as agentloop tools.

Declare servers in code (`MCPServer.stdio(...)`, `MCPServer.http(...)`) or read them from
an `mcpServers` config file (`load_config`), open an `MCPToolSource` on them, and give
its tools to an agent: they run in agentloop's registry like any other tool.
"""

from .background import BackgroundToolSource as BackgroundToolSource
from .background import MCPToolInfo as MCPToolInfo
from .background import list_config_tools as list_config_tools
from .capabilities import ElicitationHandler as ElicitationHandler
from .capabilities import terminal_elicitation as terminal_elicitation
from .config import MCPConfigError as MCPConfigError
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

__version__ = "0.1.0"

__all__ = (
    "BackgroundToolSource",
    "ElicitationHandler",
    "MCPConfigError",
    "MCPConnectError",
    "MCPProblem",
    "MCPRequestError",
    "MCPSampling",
    "MCPServer",
    "MCPTool",
    "MCPToolInfo",
    "MCPToolSource",
    "list_config_tools",
    "load_config",
    "parse_config",
    "terminal_elicitation",
    "to_content",
)
