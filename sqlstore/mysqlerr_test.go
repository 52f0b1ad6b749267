package sqlstore

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// mysqlErrno finds the driver's error number through %w chains, including
// the two-%w wrapping of unavailable.
func TestMySQLErrno(t *testing.T) {
	base := &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}
	for name, err := range map[string]error{
		"bare":        base,
		"wrapped":     fmt.Errorf("x: %w", base),
		"unavailable": unavailable("sweep", fmt.Errorf("y: %w", base)),
		"joined":      errors.Join(errors.New("z"), base),
	} {
		if n := mysqlErrno(err); n != 1213 {
			t.Errorf("%s: mysqlErrno = %d, want 1213", name, n)
		}
	}
	if n := mysqlErrno(errors.New("Error 1213")); n != 0 {
		t.Errorf("a plain error: %d, want 0", n)
	}
}
