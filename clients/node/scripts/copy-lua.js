"use strict";
// npm pack's prepack: copy the Python package's Lua scripts (captcha_tasks/state/lua) into
// ./lua, which the tarball ships and lib/scripts.js prefers; --clean (postpack) removes the
// copy again, so a checkout always loads the Python package's own files.
const fs = require("fs");
const path = require("path");

const source = path.join(__dirname, "..", "..", "..", "captcha_tasks", "state", "lua");
const target = path.join(__dirname, "..", "lua");

fs.rmSync(target, { recursive: true, force: true });
if (!process.argv.includes("--clean")) {
  for (const dir of fs.readdirSync(source)) {
    const from = path.join(source, dir);
    if (!fs.statSync(from).isDirectory() || dir.startsWith("_")) continue;
    for (const file of fs.readdirSync(from).filter((name) => name.endsWith(".lua"))) {
      fs.mkdirSync(path.join(target, dir), { recursive: true });
      fs.copyFileSync(path.join(from, file), path.join(target, dir, file));
    }
  }
}
