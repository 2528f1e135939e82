// gpuivf under LangChain.js: PGVectorStore (@langchain/community) creates
// its table (a vector(n) column), adds documents and runs its own similarity
// search SQL; the test creates a gpuivf index on that column and checks that
// the store's query, with its bound parameters, is answered by the index.
// Embeddings come from a deterministic bag-of-words hash (no model, no
// network).  Connection from the PG* environment variables.  Prints one JSON
// object; test/t/502_client_langchain.pl asserts on it.
import pg from 'pg';
import { Embeddings } from '@langchain/core/embeddings';
import { Document } from '@langchain/core/documents';
import { PGVectorStore } from '@langchain/community/vectorstores/pgvector';

const DIMS = 64;
const DOCS = 2000;
const LISTS = 20;

function hash(word) {
  let h = 2166136261;
  for (const c of word) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
  return h;
}

// Words hashed into DIMS buckets (two per word, signed), so texts sharing
// words are near under cosine distance.
class HashEmbeddings extends Embeddings {
  constructor() {
    super({});
  }
  vector(text) {
    const v = new Array(DIMS).fill(0);
    for (const word of text.toLowerCase().split(/\W+/).filter(Boolean)) {
      const h = hash(word);
      v[h % DIMS] += 1;
      v[(h >>> 8) % DIMS] += (h & 1) ? 0.5 : -0.5;
    }
    return v;
  }
  async embedDocuments(texts) {
    return texts.map((t) => this.vector(t));
  }
  async embedQuery(text) {
    return this.vector(text);
  }
}

const topics = ['postgres index', 'gpu kernel', 'vector search', 'query planner', 'write ahead log',
  'buffer cache', 'k means', 'product quantization', 'recall curve', 'batch join'];
const words = ['fast', 'large', 'exact', 'approximate', 'parallel', 'memory', 'disk', 'page', 'list',
  'probe', 'table', 'row', 'cluster', 'replica', 'shard', 'worker', 'stream', 'latency', 'throughput'];
let seed = 7;
const next = (n) => {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
  return (seed >>> 8) % n;
};
const docs = Array.from({ length: DOCS }, (_, i) => {
  const topic = topics[i % topics.length];
  const extra = Array.from({ length: 4 }, () => words[next(words.length)]).join(' ');
  return new Document({ pageContent: `${topic} ${extra} note ${i}`, metadata: { topic, n: i } });
});

const out = {};
const embeddings = new HashEmbeddings();
const setup = new pg.Client();
await setup.connect();
await setup.query('CREATE EXTENSION IF NOT EXISTS gpuivf_vector CASCADE');

const config = (options) => ({
  pool: new pg.Pool(options ? { options } : {}),
  tableName: 'documents',
  distanceStrategy: 'cosine',
  dimensions: DIMS,
});
const store = await PGVectorStore.initialize(embeddings, config());
await store.addDocuments(docs);

await setup.query(`CREATE INDEX documents_embedding_idx ON documents USING gpuivf (embedding vector_cosine_ops) WITH (lists = ${LISTS})`);
await setup.query('ANALYZE documents');

// the store's own SQL and parameters, captured as it sends them
let last = null;
const send = store.pool.query.bind(store.pool);
store.pool.query = (text, values) => {
  last = { text, values };
  return send(text, values);
};
const questions = ['gpu kernel latency', 'postgres index page', 'recall curve probe', 'buffer cache memory',
  'product quantization list', 'batch join worker'];
const answers = [];
for (const q of questions) answers.push(await store.similaritySearchWithScore(q, 5));
out.sql = last.text;
const plan = await setup.query(`EXPLAIN (FORMAT JSON) ${last.text}`, last.values);
out.plan = JSON.stringify(plan.rows[0]['QUERY PLAN']);
out.topic_matches = answers.map((a, i) => a.filter(([doc]) => questions[i].startsWith(doc.metadata.topic.split(' ')[0])).length);
out.results = answers.map((a) => a.length);

// the same search through stores whose connections scan exactly (every
// list) and sequentially: equal answers
// (ordered by distance, then document: rows at equal distance may come in
// either order from either plan)
const ids = (a) => a.map(([doc, score]) => [score, doc.metadata.n])
  .sort((x, y) => x[0] - y[0] || x[1] - y[1])
  .map(([score, n]) => `${n}:${score}`).join(',');
const exact = await PGVectorStore.initialize(embeddings, config(`-c gpuivf.probes=${LISTS}`));
const seq = await PGVectorStore.initialize(embeddings, config('-c enable_indexscan=off -c enable_bitmapscan=off'));
out.exact_equals_seqscan = true;
for (const q of questions) {
  const e = await exact.similaritySearchWithScore(q, 5);
  const s = await seq.similaritySearchWithScore(q, 5);
  if (ids(e) !== ids(s)) out.exact_equals_seqscan = false;
}
await setup.query(`SELECT gpuivf_verify('documents_embedding_idx', true)`);
out.verified = true;
await Promise.all([store.end(), exact.end(), seq.end(), setup.end()]);
console.log(JSON.stringify(out));
