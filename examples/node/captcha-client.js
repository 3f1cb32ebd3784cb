"use strict";
/**
 * A Node.js client of captcha-tasks' Kafka contract (see ../../captcha_tasks/schemas/):
 * it produces tasks on `captcha-tasks` (key: task_id) and reads their outcomes from
 * `captcha-results` (key: task_id), answered by `captcha-tasks kafka-bridge` and the
 * Celery workers.
 *
 *   const client = new CaptchaClient({ brokers: ["localhost:9092"] });
 *   await client.connect();
 *   client.on("result", (outcome) => console.log(outcome.index, outcome.status));
 *   client.on("done", (summary) => console.log(summary));
 *   client.stream(tasks, { window: 30 });
 *   // or, one at a time: const outcome = await client.solve({ method, sitekey, pageurl });
 *
 * Events (like the streaming seed's CaptchaStream):
 *   "result"  one outcome per task of stream(), with its input `index` and `task_id`,
 *             in completion order ({status: "solved", token, ...} or {status: "failed",
 *             error, message, ...})
 *   "done"    once every task of stream() is answered: {solved, failed}
 *   "error"   the Kafka client failed
 */
const { EventEmitter } = require("events");
const { randomUUID } = require("crypto");
const { Kafka, logLevel } = require("kafkajs");

class CaptchaClient extends EventEmitter {
  constructor({
    brokers = ["localhost:9092"],
    tasksTopic = "captcha-tasks",
    resultsTopic = "captcha-results",
    clientId = "captcha-tasks-node",
  } = {}) {
    super();
    this.tasksTopic = tasksTopic;
    this.resultsTopic = resultsTopic;
    this.kafka = new Kafka({ clientId, brokers, logLevel: logLevel.WARN });
    this.producer = this.kafka.producer();
    // A group of its own: every client reads every result and keeps those of its tasks.
    this.consumer = this.kafka.consumer({ groupId: `${clientId}-${randomUUID()}` });
    this.waiting = new Map(); // task_id -> callback(outcome)
  }

  /** Connect, and read results from the topic's current end (those of our tasks to come). */
  async connect() {
    const admin = this.kafka.admin();
    await admin.connect();
    const ends = await admin.fetchTopicOffsets(this.resultsTopic);
    await admin.disconnect();
    await this.producer.connect();
    await this.consumer.connect();
    const joined = new Promise((resolve) => {
      this.consumer.on(this.consumer.events.GROUP_JOIN, resolve);
    });
    this.consumer.on(this.consumer.events.CRASH, (event) => this.emit("error", event.payload.error));
    await this.consumer.subscribe({ topics: [this.resultsTopic] });
    await this.consumer.run({ eachMessage: async ({ message }) => this._onResult(message) });
    for (const { partition, high } of ends) {
      this.consumer.seek({ topic: this.resultsTopic, partition, offset: high });
    }
    await joined;
    return this;
  }

  /** Produce one task; returns its task_id (made up when the task has none). */
  async submit(task, onResult) {
    const taskId = task.task_id || randomUUID();
    if (onResult) this.waiting.set(taskId, onResult);
    const value = JSON.stringify({ ...task, task_id: taskId });
    await this.producer.send({ topic: this.tasksTopic, messages: [{ key: taskId, value }] });
    return taskId;
  }

  /** Solve one task: resolves with its outcome (a failed one included). */
  solve(task) {
    return new Promise((resolve, reject) => {
      this.submit(task, resolve).catch(reject);
    });
  }

  /**
   * Solve `tasks`, at most `window` unanswered at a time: a "result" event per task, in
   * completion order, each with its `index`, then "done".
   */
  stream(tasks, { window = 30 } = {}) {
    const queue = tasks.map((task, index) => ({ task, index }));
    const counts = { solved: 0, failed: 0 };
    let open = 0;
    const next = () => {
      while (open < window && queue.length > 0) {
        const { task, index } = queue.shift();
        open++;
        this.submit(task, (outcome) => {
          open--;
          counts[outcome.status === "solved" ? "solved" : "failed"]++;
          this.emit("result", { ...outcome, index });
          if (open === 0 && queue.length === 0) this.emit("done", counts);
          else next();
        }).catch((err) => this.emit("error", err));
      }
    };
    if (tasks.length === 0) setImmediate(() => this.emit("done", counts));
    next();
    return this;
  }

  _onResult(message) {
    const taskId = message.key && message.key.toString();
    const callback = this.waiting.get(taskId);
    if (!callback) return; // another client's task
    this.waiting.delete(taskId);
    callback(JSON.parse(message.value.toString()));
  }

  async close() {
    await this.consumer.disconnect();
    await this.producer.disconnect();
  }
}

module.exports = { CaptchaClient };
