package keylane

import "strconv"

// add adds n to a key's counter, as a State's UpdateFunc (the store's own
// tests are in internal/statestore).
func add(n int) UpdateFunc {
	return func(cur []byte) ([]byte, []byte, error) {
		v, _ := strconv.Atoi(string(cur))
		v += n
		return []byte(strconv.Itoa(v)), []byte("now " + strconv.Itoa(v)), nil
	}
}
