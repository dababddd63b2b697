from alpa_comm.cli import main


def test_simulate_single_with_exports(tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    assert main(["simulate", "--shape", "256,256,4", "--src-mesh", "2x4@0,1", "--src-spec", "RS0R",
                 "--dst-mesh", "2x4@2,3", "--dst-spec", "S0RR", "--loadbalance", "naive",
                 "--trace", str(trace), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "simulated:" in out and "NIC busy" in out
    assert trace.exists() and png.exists()


def test_simulate_suite_writes_outputs(tmp_path, capsys):
    assert main(["simulate", "--suite", "balance", "--last-dim", "4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bc_dfs" in out and "speedup vs alpa" in out
    for name in ("balance.md", "balance.json", "balance.png"):
        assert (tmp_path / name).exists()


def test_simulate_bad_suite(capsys):
    assert main(["simulate", "--suite", "everything"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--suite" in err and "everything" in err
