"""A stand-in for the system browser (`BROWSER="python oauth_browser.py %s"`): opens the
authorization URL, follows the redirects back to the login's callback page, and exits 0
when that page says the login worked."""

from __future__ import annotations

import sys

import httpx2

page = httpx2.get(sys.argv[1], follow_redirects=True, timeout=30.0)
sys.exit(0 if page.status_code == 200 and "Logged in" in page.text else 1)
