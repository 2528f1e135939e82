// gpuivf driven as an application drives pgvector: node-postgres (`pg`) with
// pgvector-node (`pgvector`), bound parameters, pgvector.toSql for input and
// registerTypes for output.  Connection from the PG* environment variables
// (test/t/501_client_node_pg.pl sets them).  Prints one JSON object with what
// it saw; the TAP test asserts on it.
import pg from 'pg';
import pgvector from 'pgvector/pg';

const DIMS = 32;
const ROWS = 3000;
const QUERIES = 25;
const K = 10;
const LISTS = 30;

// mulberry32: the same data on every run
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(20240601);
const centres = Array.from({ length: 40 }, () => Array.from({ length: DIMS }, () => rand() * 8 - 4));
const point = () => {
  const c = centres[Math.floor(rand() * centres.length)];
  // float32 values, as the database will store them
  return c.map((x) => Math.fround(x + rand() * 2 - 1));
};

const out = {};
const client = new pg.Client();
await client.connect();
try {
  await client.query('CREATE EXTENSION IF NOT EXISTS gpuivf_vector CASCADE');
  await pgvector.registerTypes(client);
  await client.query(`CREATE TABLE items (id bigserial PRIMARY KEY, title text, embedding vector(${DIMS}))`);

  // inserts in batches of bound parameters, as an application writes them
  const rows = Array.from({ length: ROWS }, point);
  for (let start = 0; start < ROWS; start += 500) {
    const batch = rows.slice(start, start + 500);
    const params = [];
    const values = batch.map((v, i) => {
      params.push(`item ${start + i}`, pgvector.toSql(v));
      return `($${2 * i + 1}, $${2 * i + 2})`;
    });
    await client.query(`INSERT INTO items (title, embedding) VALUES ${values.join(', ')}`, params);
  }

  await client.query(`CREATE INDEX items_embedding_idx ON items USING gpuivf (embedding vector_l2_ops) WITH (lists = ${LISTS})`);
  await client.query('ANALYZE items');

  const knn = `SELECT id, title, embedding, embedding <-> $1 AS distance FROM items ORDER BY embedding <-> $1 LIMIT $2`;
  const queries = Array.from({ length: QUERIES }, point);

  // the plan of the application's query, with its parameters bound
  const plan = await client.query({ text: `EXPLAIN (FORMAT JSON) ${knn}`, values: [pgvector.toSql(queries[0]), K] });
  out.plan = JSON.stringify(plan.rows[0]['QUERY PLAN']);

  const ask = async () => {
    const answers = [];
    for (const q of queries) {
      const r = await client.query(knn, [pgvector.toSql(q), K]);
      answers.push(r.rows);
    }
    return answers;
  };
  const approx = await ask();

  // exact answers by a sequential scan, and by the index in exact mode
  await client.query('SET enable_indexscan = off');
  await client.query('SET enable_bitmapscan = off');
  const seq = await ask();
  await client.query('RESET enable_indexscan');
  await client.query('RESET enable_bitmapscan');
  await client.query(`SET gpuivf.probes = ${LISTS}`);
  const exact = await ask();
  await client.query('RESET gpuivf.probes');

  const ids = (answer) => answer.map((row) => String(row.id));
  let hits = 0;
  out.exact_equals_seqscan = true;
  out.distances_ascending = true;
  out.embeddings_round_trip = true;
  for (let i = 0; i < QUERIES; i++) {
    const truth = new Set(ids(seq[i]));
    hits += ids(approx[i]).filter((id) => truth.has(id)).length;
    if (ids(exact[i]).join(',') !== ids(seq[i]).join(',')) out.exact_equals_seqscan = false;
    for (let j = 1; j < approx[i].length; j++) {
      if (approx[i][j].distance < approx[i][j - 1].distance) out.distances_ascending = false;
    }
    for (const row of approx[i]) {
      const inserted = rows[Number(row.id) - 1];
      // registerTypes parses the vector column into an array of numbers
      // (the shortest decimal of each float32, hence fround)
      if (!Array.isArray(row.embedding) || row.embedding.length !== DIMS ||
          row.embedding.some((x, d) => Math.fround(x) !== inserted[d])) out.embeddings_round_trip = false;
    }
  }
  out.rows_returned = approx.reduce((n, a) => n + a.length, 0);
  out.recall = hits / (QUERIES * K);

  // a row inserted after the build is found by the next query
  const fresh = point();
  const ins = await client.query('INSERT INTO items (title, embedding) VALUES ($1, $2) RETURNING id', ['fresh', pgvector.toSql(fresh)]);
  const found = await client.query(knn, [pgvector.toSql(fresh), 1]);
  out.fresh_row_found = found.rows.length === 1 && String(found.rows[0].id) === String(ins.rows[0].id) &&
    found.rows[0].distance === 0;

  const info = await client.query(`SELECT gpuivf_index_info('items_embedding_idx') AS info`);
  out.index_info = info.rows[0].info;
  await client.query(`SELECT gpuivf_verify('items_embedding_idx', true)`);
  out.verified = true;
} finally {
  await client.end();
}
console.log(JSON.stringify(out));
