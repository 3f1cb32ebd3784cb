"use strict";
// index.d.ts compiles against a use of every documented call (test/types/usage.ts).  The
// compiler is told where the dependencies are (NODE_PATH under pytest: TypeScript itself
// does not read it).
const test = require("node:test");
const assert = require("node:assert/strict");
const { execFileSync } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");

function packageDir(name) {
  return path.dirname(require.resolve(`${name}/package.json`));
}

test("the TypeScript types describe the documented API", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "ct-node-types-"));
  const config = {
    compilerOptions: {
      strict: true,
      noEmit: true,
      module: "commonjs",
      target: "es2022",
      types: ["node"],
      typeRoots: [path.dirname(packageDir("@types/node"))],
      paths: {
        "captcha-tasks": [path.join(__dirname, "..", "index.d.ts")],
        ioredis: [path.join(packageDir("ioredis"), "built", "index.d.ts")],
      },
    },
    files: [path.join(__dirname, "types", "usage.ts")],
  };
  fs.writeFileSync(path.join(dir, "tsconfig.json"), JSON.stringify(config));
  try {
    execFileSync(process.execPath, [require.resolve("typescript/bin/tsc"), "-p", dir], { encoding: "utf8" });
  } catch (err) {
    assert.fail(`tsc found errors:\n${err.stdout}${err.stderr}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
