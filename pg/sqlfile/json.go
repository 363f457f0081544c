package sqlfile

import (
	"bytes"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// rowJSON makes a row a JSON object, its columns in their order, and
// returns its job_id column's text ("" without one). With byJob (a set's
// row) job_id is left out of the object: it says whose row it is, and a
// job's result is the same whether its type is a set or not.
func rowJSON(fields []pgconn.FieldDescription, vals []any, byJob bool) (json.RawMessage, string, error) {
	var b bytes.Buffer
	var jobID string
	b.WriteByte('{')
	first := true
	for i, fd := range fields {
		if fd.Name == "job_id" {
			if s, ok := vals[i].(string); ok {
				jobID = s
			}
			if byJob {
				continue
			}
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		name, _ := json.Marshal(fd.Name)
		b.Write(name)
		b.WriteByte(':')
		v, err := valueJSON(fd.DataTypeOID, vals[i])
		if err != nil {
			return nil, "", fmt.Errorf("sqlfile: column %q: %w", fd.Name, err)
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), jobID, nil
}

// valueJSON is one column's value in JSON: numbers and booleans as
// such, numeric as a JSON number (NaN and infinities as strings), uuid
// in its usual text, date as 2006-01-02, timestamps in RFC 3339, json
// and jsonb as themselves, bytea in base64, and any other type in the
// text pgx gives it (an interval's "1 day", a time's "12:00:00").
func valueJSON(oid uint32, v any) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return []byte("null"), nil
	case [16]byte:
		if oid == pgtype.UUIDOID {
			return json.Marshal(fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16]))
		}
	case time.Time:
		if oid == pgtype.DateOID {
			return json.Marshal(x.Format(time.DateOnly))
		}
	case pgtype.Numeric:
		return x.MarshalJSON()
	case driver.Valuer:
		dv, err := x.Value()
		if err != nil {
			return nil, err
		}
		return json.Marshal(dv)
	}
	b, err := json.Marshal(v)
	if err != nil {
		// A value JSON has no place for (a float's NaN): its text.
		return json.Marshal(fmt.Sprint(v))
	}
	return b, nil
}
