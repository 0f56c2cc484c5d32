// The 30 JSON schemas of the structured-outputs bench (structured.ts): the kinds of response formats
// clients send. Records with nested objects, enums, arrays, the supported formats (date, time,
// date-time, email, uuid), patterns, integer ranges, unions (anyOf), recursion through $ref, and
// two short maxLength strings (each bounded string costs a pass over the vocabulary per
// character when compiled, see SCHEMA_LIMITS). Every schema is distinct, so each compiles fresh.

type Schema = Record<string, unknown>;

/** A closed object; every property required unless `optional` names it. */
const obj = (properties: Record<string, Schema>, optional: string[] = []): Schema => ({
  type: 'object', properties, required: Object.keys(properties).filter((k) => !optional.includes(k)), additionalProperties: false,
});
const str: Schema = { type: 'string' };
const int = (minimum?: number, maximum?: number): Schema => ({ type: 'integer', ...(minimum !== undefined && { minimum }), ...(maximum !== undefined && { maximum }) });
const num = (minimum?: number, maximum?: number): Schema => ({ type: 'number', ...(minimum !== undefined && { minimum }), ...(maximum !== undefined && { maximum }) });
const bool: Schema = { type: 'boolean' };
const oneOf = (...values: string[]): Schema => ({ enum: values });
const fmt = (format: string): Schema => ({ type: 'string', format });
const pattern = (p: string): Schema => ({ type: 'string', pattern: p });
const array = (items: Schema, maxItems?: number, minItems?: number): Schema =>
  ({ type: 'array', items, ...(minItems !== undefined && { minItems }), ...(maxItems !== undefined && { maxItems }) });
const nullable = (type: string): Schema => ({ type: [type, 'null'] });
const ref = (name: string): Schema => ({ $ref: `#/$defs/${name}` });
const recursive = (name: string, def: Schema): Schema => ({ $defs: { [name]: def }, ...ref(name) });

export function benchSchemas(): Schema[] {
  return [
    obj({ id: fmt('uuid'), name: str, email: fmt('email'), age: int(0, 130), roles: array(oneOf('admin', 'editor', 'viewer'), 3),
      address: obj({ street: str, city: str, postalCode: pattern('^[0-9]{5}$'), country: oneOf('US', 'CA', 'MX') }) }),
    obj({ orderId: pattern('^ORD-[0-9]{6}$'), placedAt: fmt('date-time'), customer: obj({ name: str, email: fmt('email') }),
      items: array(obj({ sku: pattern('^[A-Z]{3}-[0-9]{4}$'), quantity: int(1, 100), unitPrice: num(0) }), 20, 1),
      status: oneOf('pending', 'paid', 'shipped', 'delivered', 'cancelled') }),
    obj({ sentiment: oneOf('positive', 'negative', 'neutral', 'mixed'), confidence: num(0, 1) }),
    obj({ entities: array(obj({ text: str, type: oneOf('person', 'organization', 'location', 'date', 'other'), start: int(0), end: int(0) })) }),
    obj({ title: str, start: fmt('date-time'), end: fmt('date-time'), attendees: array(fmt('email'), 50), location: nullable('string'),
      recurrence: oneOf('none', 'daily', 'weekly', 'monthly') }),
    obj({ city: str, date: fmt('date'), highC: int(-60, 60), lowC: int(-60, 60), conditions: oneOf('sunny', 'cloudy', 'rain', 'snow', 'storm', 'fog'),
      precipitationChance: int(0, 100) }),
    recursive('comment', obj({ author: str, body: str, likes: int(0), replies: array(ref('comment'), 10) })),
    recursive('node', obj({ name: str, kind: oneOf('file', 'directory'), sizeBytes: int(0), children: array(ref('node')) }, ['children'])),
    obj({ function: oneOf('search_documents', 'get_weather', 'send_email', 'create_ticket'),
      arguments: obj({ query: str, limit: int(1, 50), filters: obj({ after: fmt('date'), tags: array(str, 10) }, ['after', 'tags']) }) }),
    obj({ sku: pattern('^[A-Z]{3}-[0-9]{4}$'), name: str, price: obj({ amount: num(0), currency: oneOf('USD', 'EUR', 'GBP', 'JPY') }), inStock: bool,
      categories: array(str, 5), dimensions: obj({ widthCm: num(0), heightCm: num(0), depthCm: num(0) }) }),
    obj({ invoiceNumber: pattern('^INV-[0-9]{4}-[0-9]{5}$'), issueDate: fmt('date'), dueDate: fmt('date'),
      lines: array(obj({ description: str, hours: num(0, 1000), rate: num(0) }), 50, 1), total: num(0), paid: bool }),
    obj({ label: { type: 'string', maxLength: 20 }, reasons: array(str, 3), score: int(1, 5) }),
    obj({ steps: array(obj({ explanation: str, expression: str })), finalAnswer: num() }),
    obj({ date: fmt('date'), attendees: array(str), decisions: array(str), actionItems: array(obj({ owner: str, task: str, due: fmt('date') })) }),
    obj({ sql: str, tables: array(pattern('^[a-z_][a-z0-9_]*$'), 8, 1), estimatedRows: int(0), usesIndex: bool }),
    obj({ line1: str, line2: nullable('string'), city: str, region: str, postalCode: str, countryCode: pattern('^[A-Z]{2}$') }),
    obj({ title: str, servings: int(1, 12), prepMinutes: int(0, 600),
      ingredients: array(obj({ name: str, amount: num(0), unit: oneOf('g', 'kg', 'ml', 'l', 'tsp', 'tbsp', 'cup', 'piece') })), steps: array(str) }),
    array({ anyOf: [
      obj({ op: { const: 'add' }, path: pattern('^(/[a-z0-9_]+)+$'), value: str }),
      obj({ op: { const: 'remove' }, path: pattern('^(/[a-z0-9_]+)+$') }),
      obj({ op: { const: 'replace' }, path: pattern('^(/[a-z0-9_]+)+$'), value: str }),
    ] }, 16, 1),
    obj({ timestamp: fmt('date-time'), level: oneOf('debug', 'info', 'warn', 'error', 'fatal'), service: pattern('^[a-z][a-z0-9-]*$'), message: str,
      traceId: pattern('^[0-9a-f]{32}$'), durationMs: num(0) }),
    recursive('expr', obj({ op: oneOf('+', '-', '*', '/'), left: { anyOf: [num(), ref('expr')] }, right: { anyOf: [num(), ref('expr')] } })),
    obj({ transactionId: fmt('uuid'), amountCents: int(-1_000_000_000, 1_000_000_000), currency: oneOf('USD', 'EUR', 'GBP', 'CHF'),
      bookedAt: fmt('date-time'), counterparty: obj({ name: str, iban: pattern('^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$') }),
      category: oneOf('groceries', 'rent', 'salary', 'utilities', 'travel', 'other') }),
    obj({ tags: array(oneOf('bug', 'feature', 'question', 'docs', 'performance', 'security', 'ui', 'backend'), 4, 1), priority: int(1, 4) }),
    obj({ passengers: array(obj({ firstName: str, lastName: str, dateOfBirth: fmt('date'), seat: pattern('^[1-9][0-9]?[A-F]$') }), 9, 1),
      from: pattern('^[A-Z]{3}$'), to: pattern('^[A-Z]{3}$'), departure: fmt('date-time'), cabin: oneOf('economy', 'premium', 'business', 'first') }),
    obj({ respondentId: int(1), answers: array(obj({ questionId: int(1, 50), rating: int(1, 10), comment: nullable('string') })),
      completedAt: fmt('date-time') }),
    recursive('employee', obj({ name: str, title: str, email: fmt('email'), reports: array(ref('employee'), 8) })),
    obj({ answer: oneOf('yes', 'no', 'unsure'), shortReason: { type: 'string', maxLength: 12 } }),
    obj({ day: oneOf('mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'), slots: array(obj({ start: fmt('time'), end: fmt('time') }), 12) }),
    obj({ type: oneOf('feat', 'fix', 'docs', 'refactor', 'test', 'chore'), scope: nullable('string'), subject: str, breaking: bool,
      issues: array(int(1), 5) }),
    obj({ patientId: fmt('uuid'), measuredAt: fmt('date-time'), heartRate: int(20, 250),
      bloodPressure: obj({ systolic: int(50, 250), diastolic: int(30, 150) }), temperatureC: num(30, 45) }),
    obj({ version: pattern('^[0-9]+\\.[0-9]+\\.[0-9]+$'), owner: fmt('email'),
      features: array(obj({ name: pattern('^[a-z][a-z0-9-]*$'), enabled: bool, rolloutPercent: int(0, 100) }), 20) }),
  ];
}
