// Encode a text file with a tokenizer.json (add_special_tokens=true) and print the ids as JSON.
// Usage: node tools/encode_ids.js models/smelt-tiny/tokenizer.json tests/golden/heldout.txt > ids.json
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'node', 'node_modules', '@anush008', 'tokenizers'));
const fs = require('fs');
(async () => {
  const tok = Tokenizer.fromFile(process.argv[2]);
  const text = fs.readFileSync(process.argv[3], 'utf8');
  const enc = await tok.encode(text, null, { addSpecialTokens: true });
  process.stdout.write(JSON.stringify(enc.getIds()));
})();
