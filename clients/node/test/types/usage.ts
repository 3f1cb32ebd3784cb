// Compiled (never run) by types.test.js: the hand-written index.d.ts must describe the
// documented API, and refuse what the API refuses.
import { CaptchaTasks, PoolNotFound, StoreUnavailable, toPlaywright, recaptchaProvider } from "captcha-tasks";

async function main(): Promise<void> {
  const ct = new CaptchaTasks({ redisUrl: "redis://127.0.0.1:6379/0", keyPrefix: "captcha" });
  const token = await ct.takeToken("login", { minRemaining: 10 });
  if (token !== null) {
    const remaining: number = token.remaining_s;
    const expires: string = token.expires_at;
    void remaining, expires;
  }
  const cookies = await ct.cookies.load("shop.example");
  const version: number = cookies.version;
  const next: number = await ct.cookies.save("shop.example", { sid: "x" }, { ttl: 1800 });
  void version, next;
  const lock = ct.sessionLock("shop.example");
  const taken: boolean = await lock.acquire();
  await lock.extend();
  await lock.release();
  await lock.with(async (held) => held.domain);
  const proxy: string | null = await ct.proxies.lease("worker-1");
  await ct.proxies.release("worker-1");
  const solved = await ct.solve({ method: "turnstile", sitekey: "0x4AAA", pageurl: "https://shop.example/" }, { gateway: "http://127.0.0.1:8080", key: "k" });
  const text: string = solved.token;
  const entries = toPlaywright(cookies, "shop.example");
  const provider = recaptchaProvider(ct, { gateway: "http://127.0.0.1:8080", key: "k", pool: "login" });
  void taken, proxy, text, entries, provider;
  try {
    await ct.takeToken("nope");
  } catch (err) {
    if (err instanceof PoolNotFound || err instanceof StoreUnavailable) console.log(err.code);
  }
  // @ts-expect-error: a task needs its method
  await ct.solve({ sitekey: "k" }, { gateway: "http://x", key: "k" });
  await ct.close();
}

void main;
