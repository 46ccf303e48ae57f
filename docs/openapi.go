// Package docs holds rain's machine-readable HTTP contract: openapi.json,
// the OpenAPI 3.1 document of every endpoint (docs/api.md says the same in
// words), embedded so that rain serve answers it at GET /openapi.json and
// the API's tests validate every answer against it.
package docs

import _ "embed"

// OpenAPI is openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte
