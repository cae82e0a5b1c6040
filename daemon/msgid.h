/*
 * msgid: the journal's MESSAGE_ID of esd's main events, one fixed 128-bit
 * id each (made once with systemd-id128 new; never change one). The
 * catalog systemd/esd.catalog explains each (journalctl -x); a unit test
 * checks that it has every id here exactly once, and no other.
 */
#ifndef ESD_MSGID_H
#define ESD_MSGID_H

/* X(name, id): every event; MSGID_<name> is its id as a string. */
#define MSGID_LIST(X)                                     \
    X(CLAIMED, "fe0b67e82adc492d8cf83fe9a14a4b41")        \
    X(TAKEN_OVER, "9aac2a7963f14e7e903879704568e758")     \
    X(DONE, "5d97e15df8304591b4804a68c5b5444e")           \
    X(FAILED, "f33082f488af47f8bc33c8e99375ab03")         \
    X(MERGED, "d51059b8827f41b093f61246d5be5275")         \
    X(MERGE_FAILED, "8635264ccd714fe38115a834da400786")   \
    X(JOB_REGISTERED, "36066ec52f694931b41091282556528b") \
    X(JOB_FAILED, "8e898aae77e4461ea1b56c33c2fd62b2")     \
    X(RAY_RESTARTED, "4bad7a2f49f84da1b2d871c0f0f95d0b")

#define MSGID_CLAIMED "fe0b67e82adc492d8cf83fe9a14a4b41"
#define MSGID_TAKEN_OVER "9aac2a7963f14e7e903879704568e758"
#define MSGID_DONE "5d97e15df8304591b4804a68c5b5444e"
#define MSGID_FAILED "f33082f488af47f8bc33c8e99375ab03"
#define MSGID_MERGED "d51059b8827f41b093f61246d5be5275"
#define MSGID_MERGE_FAILED "8635264ccd714fe38115a834da400786"
#define MSGID_JOB_REGISTERED "36066ec52f694931b41091282556528b"
#define MSGID_JOB_FAILED "8e898aae77e4461ea1b56c33c2fd62b2"
#define MSGID_RAY_RESTARTED "4bad7a2f49f84da1b2d871c0f0f95d0b"

#endif
