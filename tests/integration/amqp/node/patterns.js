#!/usr/bin/env node
// RabbitMQ patterns with amqplib against one broker (argv[2]: its amqp:// URL), for
// tests/integration/amqp/test_amqplib.py: direct reply-to RPC (amqplib's own example),
// an exchange-to-exchange binding from amq.topic, FIFO priorities delivered as published,
// consumer priorities, and update-secret. Prints one JSON object of what it saw.
'use strict';

const amqp = require('amqplib');

const url = process.argv[2];
const tag = Math.random().toString(16).slice(2, 10);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function drain(channel, queue) {
  const got = [];
  for (;;) {
    const m = await channel.get(queue, { noAck: true });
    if (!m) return got;
    got.push([m.content.toString(), m.properties.priority === undefined ? null : m.properties.priority]);
  }
}

(async () => {
  const out = {};
  const conn = await amqp.connect(url);
  out.capabilities = conn.connection.serverProperties.capabilities;
  const ch = await conn.createChannel();

  // direct reply-to: the client and server of amqplib's examples, on two connections
  const server = await amqp.connect(url);
  const sch = await server.createChannel();
  const rpc = `rpc-${tag}`;
  await sch.assertQueue(rpc, { durable: false, autoDelete: true });
  await sch.consume(rpc, (m) => {
    sch.sendToQueue(m.properties.replyTo, Buffer.from(m.content.toString().toUpperCase()), {
      correlationId: m.properties.correlationId,
    });
  }, { noAck: true });
  const reply = new Promise((resolve) => {
    ch.consume('amq.rabbitmq.reply-to', (m) => resolve([m.content.toString(), m.properties.correlationId]), { noAck: true });
  });
  await sleep(100);
  ch.sendToQueue(rpc, Buffer.from('ping'), { replyTo: 'amq.rabbitmq.reply-to', correlationId: 'c1' });
  out.reply = await reply;
  await server.close();

  // an exchange-to-exchange binding from amq.topic
  const ech = await conn.createConfirmChannel();
  const dest = `fan-${tag}`;
  const q = `e2e-${tag}`;
  await ech.assertExchange(dest, 'fanout', { autoDelete: true });
  await ech.assertQueue(q, { exclusive: true });
  await ech.bindQueue(q, dest, '');
  await ech.bindExchange(dest, 'amq.topic', `${tag}.*`);
  for (const key of [`${tag}.a`, `${tag}.a.b`, `other.${tag}`]) {
    ech.publish('amq.topic', key, Buffer.from(key));
  }
  await ech.waitForConfirms();
  await sleep(300);
  out.e2e = (await drain(ech, q)).map(([body]) => body);

  // a queue without x-max-priority is FIFO; priorities come back as published
  const fifo = `fifo-${tag}`;
  await ech.assertQueue(fifo, { exclusive: true });
  ech.sendToQueue(fifo, Buffer.from('a'), { priority: 0 });
  ech.sendToQueue(fifo, Buffer.from('b'), { priority: 7 });
  ech.sendToQueue(fifo, Buffer.from('c'));
  await ech.waitForConfirms();
  out.fifo = await drain(ech, fifo);

  // consumer priorities: the higher one takes what its prefetch allows, the other the rest
  const shared = `cprio-${tag}`;
  await ech.assertQueue(shared, { exclusive: true });
  const seen = { high: [], low: [] };
  const high = await conn.createChannel();
  await high.prefetch(1);
  await high.consume(shared, (m) => seen.high.push(m.content.toString()), { priority: 5 });
  const low = await conn.createChannel();
  await low.consume(shared, (m) => seen.low.push(m.content.toString()), { priority: 1 });
  for (const body of ['1', '2', '3']) ech.sendToQueue(shared, Buffer.from(body));
  await ech.waitForConfirms();
  await sleep(500);
  out.consumer_priorities = seen;

  await conn.updateSecret(Buffer.from('guest'), 'refresh');
  out.update_secret = 'ok';
  await conn.close();
  console.log(JSON.stringify(out));
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
