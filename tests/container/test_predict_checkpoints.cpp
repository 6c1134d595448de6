// Checkpoint-aware coding (doc/container.md section 12) across files:
// cross-file casts, deltas against a previous checkpoint, reference chains
// (missing and wrong references, explicit paths), folders of checkpoint
// files, decompress_checkpoint, and the fast delta path (ref_original).

#include "predict_fixture.hpp"

using namespace predict_test;

// ---- across files and checkpoints ------------------------------------------

struct Ckpt {
  Bytes master, m, v;
};
Ckpt make_ckpt(uint32_t seed) {
  return Ckpt{normal_f32(300000, 0.02f, seed), normal_f32(300000, 1e-3f, seed + 1), normal_f32(300000, 1e-6f, seed + 2)};
}
// Next checkpoint: the master weights move a little (a small multiplicative
// step keeps sign and exponent mostly), moments are new.
Ckpt step(const Ckpt& c, uint32_t seed) {
  Ckpt n = c;
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1e-3f);
  for (size_t i = 0; i < 300000; ++i) {
    float f;
    std::memcpy(&f, &c.master[4 * i], 4);
    f *= 1.f + d(g);
    std::memcpy(&n.master[4 * i], &f, 4);
  }
  n.m = normal_f32(300000, 1e-3f, seed + 1);
  n.v = normal_f32(300000, 1e-6f, seed + 2);
  return n;
}
void write_ckpt(const std::string& model, const std::string& optim, const Ckpt& c) {
  write_st(model, {{"model.w", "BF16", "[600,500]", cast_of(c.master, tp::kCastBF16)}});
  write_st(optim, {{"state.0.master", "F32", "[600,500]", c.master},
                   {"state.0.exp_avg", "F32", "[600,500]", c.m},
                   {"state.0.exp_avg_sq", "F32", "[600,500]", c.v}});
}

TEST_F(Predict, CrossFileCastDeltaChainMissingAndWrongReferences) {
  mkdir(p("c1").c_str(), 0755);
  mkdir(p("c2").c_str(), 0755);
  mkdir(p("c3").c_str(), 0755);
  const Ckpt c1 = make_ckpt(11), c2 = step(c1, 12), c3 = step(c2, 13);
  write_ckpt(p("model1.safetensors"), p("optim1.safetensors"), c1);
  write_ckpt(p("model2.safetensors"), p("optim2.safetensors"), c2);
  write_ckpt(p("model3.safetensors"), p("optim3.safetensors"), c3);
  tc::WriteOptions o;
  o.threads = 2;
  // Model listed first: the optimizer file is still written first (source).
  tc::compress_checkpoint({p("model1.safetensors"), p("optim1.safetensors")}, {p("c1/model.tzip"), p("c1/optim.tzip")}, o);
  tc::compress_checkpoint({p("model2.safetensors"), p("optim2.safetensors")}, {p("c2/model.tzip"), p("c2/optim.tzip")}, o,
                          {p("c1/model.tzip"), p("c1/optim.tzip")});
  tc::compress_checkpoint({p("model3.safetensors"), p("optim3.safetensors")}, {p("c3/model.tzip"), p("c3/optim.tzip")}, o,
                          {"", p("c2/optim.tzip")});
  {
    tc::Reader m(p("c1/model.tzip"));
    const auto& t = entry(m, "model.w");
    EXPECT_EQ(t.predict.kind, tc::PredictKind::kCast);
    EXPECT_EQ(t.predict.source, "state.0.master");
    ASSERT_EQ(m.references().size(), 1u);
    EXPECT_EQ(m.references()[0].file, "optim.tzip");
    EXPECT_EQ(m.references()[0].xxh64, tc::Reader(p("c1/optim.tzip")).file_checksum());
    tc::Reader o2(p("c2/optim.tzip"));
    EXPECT_EQ(entry(o2, "state.0.master").predict.kind, tc::PredictKind::kDelta);
    ASSERT_EQ(o2.references().size(), 1u);
    EXPECT_EQ(o2.references()[0].file, "../c1/optim.tzip");
    // Fresh Adam moments do not pay as deltas.
    EXPECT_EQ(entry(o2, "state.0.exp_avg_sq").predict.kind, tc::PredictKind::kNone);
  }
  // Every file round-trips, c3 through the chain c3 -> c2 -> c1.
  for (int k = 1; k <= 3; ++k) {
    roundtrip(p("c" + std::to_string(k) + "/model.tzip"), p("model" + std::to_string(k) + ".safetensors"));
    roundtrip(p("c" + std::to_string(k) + "/optim.tzip"), p("optim" + std::to_string(k) + ".safetensors"));
  }
  // Random access of a delta tensor at the end of a chain.
  {
    tc::Reader r(p("c3/optim.tzip"));
    Bytes got(64);
    r.read_range((size_t)r.find("state.0.master"), 400000, 64, got.data());
    EXPECT_EQ(got, Bytes(c3.master.begin() + 400000, c3.master.begin() + 400064));
    tc::Reader mr(p("c3/model.tzip"));
    EXPECT_EQ(mr.read_tensor("model.w"), cast_of(c3.master, tp::kCastBF16));
  }

  // Missing reference: one line naming both files, nothing written.
  rename(p("c1/optim.tzip").c_str(), p("moved.tzip").c_str());
  try {
    tc::Reader r(p("c3/optim.tzip"));
    r.export_safetensors(p("x.safetensors"), tc::ReadOptions{});
    ADD_FAILURE() << "missing reference not detected";
  } catch (const tc::Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kIO) << w;
    EXPECT_NE(w.find("c2/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("c1/optim.tzip"), std::string::npos) << w;
    EXPECT_EQ(w.find('\n'), std::string::npos) << w;
  }
  EXPECT_FALSE(exists(p("x.safetensors")));
  // ... and found when its location is given (matched by checksum).
  {
    tc::Reader r(p("c2/optim.tzip"));
    tc::ReadOptions ro;
    ro.refs = {p("moved.tzip")};
    tc::ReadOptions rr = ro;
    rr.force = true;
    r.export_safetensors(p("x.safetensors"), rr);
    EXPECT_EQ(read_all(p("x.safetensors")), read_all(p("optim2.safetensors")));
    // A file that is not one of its references is refused by name.
    tc::Reader r2(p("c2/optim.tzip"));
    try {
      r2.add_reference_path(p("c3/optim.tzip"));
      ADD_FAILURE();
    } catch (const tc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a reference"), std::string::npos) << e.what();
    }
  }
  // Wrong reference under the recorded name: refused, naming both files.
  write_all(p("c1/optim.tzip"), read_all(p("c3/optim.tzip")));
  try {
    tc::Reader r(p("c2/optim.tzip"));
    r.read_tensor("state.0.master");
    ADD_FAILURE() << "wrong reference not detected";
  } catch (const tc::Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << w;
    EXPECT_NE(w.find("c2/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("c1/optim.tzip"), std::string::npos) << w;
    EXPECT_NE(w.find("not the file"), std::string::npos) << w;
  }
  // verify checks references too.
  EXPECT_THROW(tc::Reader(p("c2/optim.tzip")).verify("", tc::ReadOptions{}), tc::Error);

  // Rebase: standalone copies need no other file.
  rename(p("moved.tzip").c_str(), p("c1/optim.tzip").c_str());
  tc::rebase(p("c3/optim.tzip"), p("standalone-optim3.tzip"), tc::WriteOptions{});
  tc::rebase(p("c3/model.tzip"), p("standalone-model3.tzip"), tc::WriteOptions{});
  for (const char* f : {"standalone-optim3.tzip", "standalone-model3.tzip"}) {
    tc::Reader r(p(f));
    EXPECT_TRUE(r.references().empty()) << f;
    EXPECT_EQ(r.version_major(), 1) << f;
  }
  std::system(("rm -rf '" + p("c1") + "' '" + p("c2") + "' '" + p("c3") + "'").c_str());
  roundtrip(p("standalone-optim3.tzip"), p("optim3.safetensors"));
  roundtrip(p("standalone-model3.tzip"), p("model3.safetensors"));
}

TEST_F(Predict, FolderOfCheckpointFilesPredictsAcrossFiles) {
  mkdir(p("ck").c_str(), 0755);
  const Ckpt c = make_ckpt(21);
  write_ckpt(p("ck/a-model.safetensors"), p("ck/b-optim.safetensors"), c);
  write_all(p("ck/config.json"), Bytes{'{', '}'});
  tc::compress_folder(p("ck"), p("ck.tzip"), tc::WriteOptions{});
  tc::Reader m(p("ck.tzip/a-model.tzip"));
  EXPECT_EQ(entry(m, "model.w").predict.kind, tc::PredictKind::kCast);
  ASSERT_EQ(m.references().size(), 1u);
  EXPECT_EQ(m.references()[0].file, "b-optim.tzip");
  tc::decompress_folder(p("ck.tzip"), p("out"), tc::ReadOptions{});
  for (const char* f : {"a-model.safetensors", "b-optim.safetensors", "config.json"})
    EXPECT_EQ(read_all(p("out/") + f), read_all(p("ck/") + f)) << f;
}

TEST_F(Predict, DecompressCheckpointRestoresSourcesFirstAndUsesThem) {
  mkdir(p("z").c_str(), 0755);
  mkdir(p("out").c_str(), 0755);
  const Ckpt c = make_ckpt(31);
  write_ckpt(p("model.safetensors"), p("optim.safetensors"), c);
  tc::compress_checkpoint({p("model.safetensors"), p("optim.safetensors")}, {p("z/model.tzip"), p("z/optim.tzip")},
                          tc::WriteOptions{});
  // The model file is listed first but needs the optimizer file.
  tc::decompress_checkpoint({p("z/model.tzip"), p("z/optim.tzip")}, {p("out/model.safetensors"), p("out/optim.safetensors")},
                            tc::ReadOptions{});
  EXPECT_EQ(read_all(p("out/model.safetensors")), read_all(p("model.safetensors")));
  EXPECT_EQ(read_all(p("out/optim.safetensors")), read_all(p("optim.safetensors")));
  // Predictors come from the restored optimizer file: once it is restored,
  // the model file decodes even if the optimizer .tzip then disappears.
  tc::Reader m(p("z/model.tzip"));
  m.add_reference_original(p("z/optim.tzip"), p("out/optim.safetensors"));
  rename(p("z/optim.tzip").c_str(), p("gone.tzip").c_str());
  EXPECT_EQ(m.read_tensor("model.w"), cast_of(c.master, tp::kCastBF16));
  tc::ReadOptions f;
  f.force = true;
  m.export_safetensors(p("again.safetensors"), f);
  EXPECT_EQ(read_all(p("again.safetensors")), read_all(p("model.safetensors")));
}

// ---- fast delta path and reference chains ------------------------------------

TEST_F(Predict, RefOriginalGivesTheSameFileAndIsChecked) {
  const size_t n = 300000;
  Bytes m1 = normal_f32(n, 0.02f, 6);
  Bytes m2 = m1;
  std::mt19937 g(7);
  std::normal_distribution<float> d(0.f, 1e-4f);
  for (size_t i = 0; i < n; ++i) {
    const float v = u2f(f2u(*(float*)&m1[4 * i]));
    const float w = v + d(g) * std::fabs(v);
    std::memcpy(&m2[4 * i], &w, 4);
  }
  write_st(p("s1.safetensors"), {{"m", "F32", "[300000]", m1}, {"small", "F32", "[1000]", Bytes(m1.begin(), m1.begin() + 4000)}});
  write_st(p("s2.safetensors"), {{"m", "F32", "[300000]", m2}, {"small", "F32", "[1000]", Bytes(m2.begin(), m2.begin() + 4000)}});
  tc::WriteOptions o;
  o.chunk_bytes = 1u << 20;
  tc::compress_file(p("s1.safetensors"), p("s1.tzip"), o);
  o.ref = p("s1.tzip");
  tc::compress_file(p("s2.safetensors"), p("slow.tzip"), o);
  o.ref_original = p("s1.safetensors");
  tc::compress_file(p("s2.safetensors"), p("fast.tzip"), o);
  EXPECT_EQ(read_all(p("slow.tzip")), read_all(p("fast.tzip")));
  tc::Reader r(p("fast.tzip"));
  EXPECT_EQ(entry(r, "m").predict.kind, tc::PredictKind::kDelta);
  roundtrip(p("fast.tzip"), p("s2.safetensors"));
  // Reader::check_bytes: by block checksums (s1, stored as itself) and by
  // decoding (fast.tzip's 'm' is a delta), on an unaligned range.
  {
    for (const char* name : {"s1", "fast"}) {
      tc::Reader r(p(std::string(name) + ".tzip"));
      const Bytes st = read_all(p(std::string(name == std::string("s1") ? "s1" : "s2") + ".safetensors"));
      const uint64_t base = tc::read_safetensors_info(p("s1.safetensors")).data_start + entry(r, "m").data_begin;
      Bytes mine(st.begin() + base, st.begin() + base + 4 * n);
      auto from = [&](const Bytes& b) {
        return [&b](uint64_t o, uint64_t len, uint8_t* dst) { std::memcpy(dst, b.data() + o, len); };
      };
      const size_t mi = (size_t)r.find("m");
      EXPECT_TRUE(r.check_bytes(mi, 1000, 700000, from(mine))) << name;
      mine[900000] ^= 1;
      EXPECT_TRUE(r.check_bytes(mi, 1000, 700000, from(mine))) << name;  // outside the covering blocks
      EXPECT_FALSE(r.check_bytes(mi, 0, 4 * n, from(mine))) << name;
    }
  }
  // Read side: the reference's content given as its safetensors file.
  tc::ReadOptions ro;
  ro.refs = {p("s1.tzip")};
  ro.ref_originals = {p("s1.safetensors")};
  roundtrip(p("fast.tzip"), p("s2.safetensors"), ro);
  ro.ref_originals = {p("s1.tzip")};  // not a safetensors file of that header and size
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  ro.ref_originals = {};
  ro.refs.clear();
  ro.ref_originals = {p("s1.safetensors")};  // without its --ref
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  // A wrong original of the same layout (one byte of 'm' changed, in its
  // first block, away from the discovery sample): caught by the block
  // checksums on both sides.
  {
    tc::Reader r1(p("s1.tzip"));
    const tc::TensorEntry& e = entry(r1, "m");
    ASSERT_GT(e.n_blocks(), 2u);
    const uint64_t at = tc::read_safetensors_info(p("s1.safetensors")).data_start + e.data_begin + 10;
    Bytes bad = read_all(p("s1.safetensors"));
    bad[at] ^= 0x40;
    write_all(p("bad1.safetensors"), bad);
  }
  tc::WriteOptions ob;
  ob.chunk_bytes = 1u << 20;
  ob.ref = p("s1.tzip");
  ob.ref_original = p("bad1.safetensors");
  try {
    tc::compress_file(p("s2.safetensors"), p("y.tzip"), ob);
    FAIL() << "a wrong ref_original must be refused";
  } catch (const tc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(exists(p("y.tzip")));
  ro.refs = {p("s1.tzip")};
  ro.ref_originals = {p("bad1.safetensors")};
  EXPECT_THROW(roundtrip(p("fast.tzip"), p("s2.safetensors"), ro), tc::Error);
  // Another safetensors file as ref_original: refused (header/size check).
  o.ref_original = p("s2.safetensors");
  write_st(p("other.safetensors"), {{"m", "F32", "[3]", normal_f32(3, 1.f, 1)}});
  o.ref_original = p("other.safetensors");
  EXPECT_THROW(tc::compress_file(p("s2.safetensors"), p("x.tzip"), o), tc::Error);
  o.ref.clear();
  EXPECT_THROW(tc::compress_file(p("s2.safetensors"), p("x.tzip"), o), tc::Error);
  EXPECT_FALSE(exists(p("x.tzip")));
}

TEST_F(Predict, ReferencePathsForAWholeChain) {
  const size_t n = 200000;
  Bytes m = normal_f32(n, 0.02f, 8);
  std::vector<std::string> st;
  for (int k = 0; k < 3; ++k) {
    st.push_back(p("c" + std::to_string(k) + ".safetensors"));
    write_st(st.back(), {{"m", "F32", "[200000]", m}});
    for (size_t i = 0; i < n; i += 3) m[4 * i] ^= 1;  // small change in the lowest mantissa byte
  }
  tc::WriteOptions o;
  tc::compress_file(st[0], p("c0.tzip"), o);
  o.ref = p("c0.tzip");
  tc::compress_file(st[1], p("c1.tzip"), o);
  o.ref = p("c1.tzip");
  tc::compress_file(st[2], p("c2.tzip"), o);
  ASSERT_EQ(entry(tc::Reader(p("c2.tzip")), "m").predict.kind, tc::PredictKind::kDelta);
  mkdir(p("a").c_str(), 0755);
  mkdir(p("b").c_str(), 0755);
  ASSERT_EQ(rename(p("c0.tzip").c_str(), p("a/zero.tzip").c_str()), 0);
  ASSERT_EQ(rename(p("c1.tzip").c_str(), p("b/one.tzip").c_str()), 0);
  {
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("a/zero.tzip"), p("b/one.tzip")});  // any order, the deeper one passed on
    r.check_references();
    const Bytes all = read_all(st[2]);
    EXPECT_EQ(r.read_tensor("m"), Bytes(all.end() - 4 * n, all.end()));
  }
  tc::ReadOptions ro;
  ro.refs = {p("b/one.tzip"), p("a/zero.tzip")};
  roundtrip(p("c2.tzip"), st[2], ro);
  {
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("b/one.tzip")});
    EXPECT_THROW(r.check_references(), tc::Error);  // zero.tzip is missing at its recorded path
  }
  {
    tc::WriteOptions plain;
    plain.predict = false;
    tc::compress_file(st[1], p("unrelated.tzip"), plain);
    tc::Reader r(p("c2.tzip"));
    r.add_reference_paths({p("b/one.tzip"), p("a/zero.tzip"), p("unrelated.tzip")});
    try {
      r.check_references();
      FAIL() << "a path in no reference chain must be refused";
    } catch (const tc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("unrelated.tzip is not a reference of this file"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(Predict, FolderWithRefOriginalFolderGivesTheSameFiles) {
  mkdir(p("s1").c_str(), 0755);
  mkdir(p("s2").c_str(), 0755);
  const size_t n = 200000;
  Bytes m1 = normal_f32(n, 0.02f, 21), m2 = m1;
  for (size_t i = 0; i < n; i += 2) m2[4 * i] ^= 3;
  write_st(p("s1/optim.safetensors"), {{"master", "F32", "[200000]", m1}});
  write_st(p("s1/model.safetensors"), {{"w", "BF16", "[200000]", cast_of(m1, tp::kCastBF16)}});
  write_st(p("s2/optim.safetensors"), {{"master", "F32", "[200000]", m2}});
  write_st(p("s2/model.safetensors"), {{"w", "BF16", "[200000]", cast_of(m2, tp::kCastBF16)}});
  tc::WriteOptions o;
  tc::compress_folder(p("s1"), p("s1.tzip"), o);
  o.ref = p("s1.tzip");
  tc::compress_folder(p("s2"), p("a.tzip"), o);
  o.ref_original = p("s1");
  tc::compress_folder(p("s2"), p("b.tzip"), o);
  EXPECT_EQ(read_all(p("a.tzip/optim.tzip")), read_all(p("b.tzip/optim.tzip")));
  EXPECT_EQ(read_all(p("a.tzip/model.tzip")), read_all(p("b.tzip/model.tzip")));
  EXPECT_EQ(entry(tc::Reader(p("b.tzip/optim.tzip")), "master").predict.kind, tc::PredictKind::kDelta);
  tc::decompress_folder(p("b.tzip"), p("back"), tc::ReadOptions{});
  EXPECT_EQ(read_all(p("back/optim.safetensors")), read_all(p("s2/optim.safetensors")));
  // A file as the reference's original of a folder: refused.
  o.ref_original = p("s1/optim.safetensors");
  EXPECT_THROW(tc::compress_folder(p("s2"), p("c.tzip"), o), tc::Error);
  EXPECT_FALSE(exists(p("c.tzip")));
}
