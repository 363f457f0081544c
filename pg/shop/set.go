package shop

import (
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/inventory"
	"github.com/keylane/keylane/pg"
)

// SellSet is Sell as a keylanepg.SetHandler: the same commands, results
// and rows, with a transaction's jobs read and written together. Read
// locks the stock rows of every SKU of the transaction with one SELECT …
// FOR UPDATE; Write sells in Go, job after job in their order, from the
// stock it read, and writes every changed stock row with one statement
// and every order row with another. So the server parses and plans four
// statements a transaction whatever its number of purchases, where
// SellPipeline's cost one each.
var SellSet keylanepg.SetHandler = keylanepg.SetFunc(sellSet)

const (
	lockStockSQL = `SELECT sku, n FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku FOR UPDATE`
	// writeStockSQL sets each SKU's stock: an UPDATE for a row that
	// exists, an INSERT for one a set creates.
	writeStockSQL  = `INSERT INTO stock (sku, n) SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT (sku) DO UPDATE SET n = EXCLUDED.n`
	writeOrdersSQL = `INSERT INTO orders (sku, qty, job_id) SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])`
)

func sellSet(jobs []keylane.Job, b *pgx.Batch) (keylanepg.Write, error) {
	cmds := make([]inventory.Command, len(jobs))
	var skus []string
	seen := make(map[string]bool, len(jobs))
	for i, job := range jobs {
		cmd, err := inventory.Parse(job.Payload)
		if err == nil && cmd.Op != "buy" && cmd.Op != "set" && cmd.Op != "get" {
			err = fmt.Errorf("%w: %s is not for the shop", inventory.ErrBadCommand, cmd.Op)
		}
		if err != nil {
			// The careful path then fails this job alone.
			return nil, keylane.Permanent(fmt.Errorf("job %s: %w", job.ID, err))
		}
		cmds[i] = cmd
		if !seen[job.Key] {
			seen[job.Key] = true
			skus = append(skus, job.Key)
		}
	}
	stock := make(map[string]int64, len(skus)) // a SKU without a row is absent
	b.Queue(lockStockSQL, skus).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var sku string
			var n int64
			if err := rows.Scan(&sku, &n); err != nil {
				return err
			}
			stock[sku] = n
		}
		return rows.Err()
	})
	return func(b *pgx.Batch) ([]keylanepg.SetResult, error) {
		res := make([]keylanepg.SetResult, len(jobs))
		var (
			changed     = make(map[string]bool)
			oSKUs, oIDs []string
			oQty        []int64
		)
		for i, job := range jobs {
			cmd, n := cmds[i], stock[job.Key]
			switch cmd.Op {
			case "buy":
				if _, ok := stock[job.Key]; !ok || n < cmd.N {
					res[i].Result = []byte("soldout " + strconv.FormatInt(n, 10))
					continue
				}
				n -= cmd.N
				stock[job.Key], changed[job.Key] = n, true
				oSKUs, oQty, oIDs = append(oSKUs, job.Key), append(oQty, cmd.N), append(oIDs, job.ID)
				res[i].Result = []byte("sold " + strconv.FormatInt(n, 10))
			case "set":
				stock[job.Key], changed[job.Key] = cmd.N, true
				res[i].Result = []byte("ok " + strconv.FormatInt(cmd.N, 10))
			case "get":
				res[i].Result = []byte("stock " + strconv.FormatInt(n, 10))
			}
		}
		if len(changed) > 0 {
			var sSKUs []string
			var sN []int64
			for _, sku := range skus { // in a fixed order: skus is the jobs'
				if changed[sku] {
					sSKUs, sN = append(sSKUs, sku), append(sN, stock[sku])
				}
			}
			b.Queue(writeStockSQL, sSKUs, sN)
		}
		if len(oIDs) > 0 {
			b.Queue(writeOrdersSQL, oSKUs, oQty, oIDs)
		}
		return res, nil
	}, nil
}
