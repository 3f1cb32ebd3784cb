"use strict";
/**
 * Solve a batch through captcha-tasks' Kafka bridge and print one JSON line per outcome.
 *
 *   KAFKA_BOOTSTRAP_SERVERS=localhost:9092 node solve-batch.js tasks.json
 *   (tasks.json: a JSON list of {method, sitekey, pageurl, ...}; "-" reads stdin)
 *
 * Topics come from KAFKA_TASKS_TOPIC / KAFKA_RESULTS_TOPIC (default captcha-tasks /
 * captcha-results), as for the bridge.  The summary goes to stderr.
 */
const fs = require("fs");
const { CaptchaClient } = require("./captcha-client");

async function main() {
  const source = process.argv[2] || "-";
  const tasks = JSON.parse(fs.readFileSync(source === "-" ? 0 : source, "utf8"));
  const client = new CaptchaClient({
    brokers: (process.env.KAFKA_BOOTSTRAP_SERVERS || "localhost:9092").split(","),
    tasksTopic: process.env.KAFKA_TASKS_TOPIC || "captcha-tasks",
    resultsTopic: process.env.KAFKA_RESULTS_TOPIC || "captcha-results",
  });
  await client.connect();
  const summary = await new Promise((resolve, reject) => {
    client.on("result", (outcome) => process.stdout.write(JSON.stringify(outcome) + "\n"));
    client.on("done", resolve);
    client.on("error", reject);
    client.stream(tasks, { window: Number(process.env.WINDOW || 30) });
  });
  await client.close();
  process.stderr.write(`done: ${summary.solved} solved, ${summary.failed} failed\n`);
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
