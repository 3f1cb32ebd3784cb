-- luacheck's configuration for the Lua scripts Redis runs (captcha_tasks/state/lua/, its
-- format in that package's docstring).  tests/state/test_lua_files.py runs luacheck on
-- every .lua file, and on every script as Redis runs it (fragments included).

-- Redis runs Lua 5.1, with these globals; a script never sets a global.
std = "lua51"
read_globals = {"redis", "cjson", "KEYS", "ARGV"}
max_line_length = 100

-- What an --@include line brings into a file: each fragment lib/<name>.lua defines the
-- local <name> (a test checks this list against the files).
local fragments = {
  "batch", "board", "budget", "early", "followups", "handout", "now", "owed", "rates",
  "record", "secrets", "slots", "stats", "times",
}

-- A script file: its fragments come in by --@include; K is read by the fragments.
files["captcha_tasks/state/lua"] = {read_globals = fragments, ignore = {"211/K"}}
-- A fragment reads the including script's K (keys by name) and defines its table for the
-- scripts that include it (so on its own, the table is only written).
files["captcha_tasks/state/lua/lib"] = {read_globals = {"K"}, ignore = {"241"}}
-- now is for the scripts that include it.
files["captcha_tasks/state/lua/lib/now.lua"] = {ignore = {"311/now"}}
